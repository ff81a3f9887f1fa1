"""The applications over the library: the ``nemori-dspy`` command line (``apps.cli``), the run context every
command builds its run through (``apps.context``) and, beside them, the HTTP / MCP servers. Nothing outside
``nemori_dspy.apps`` imports from here."""

__all__: list[str] = []
