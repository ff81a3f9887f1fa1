"""The application layer: the command line and the servers, built on the core, eval and optimizers."""
