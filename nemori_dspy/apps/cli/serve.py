"""``nemori-dspy serve http|mcp|token``: serve memory to agents over HTTP (REST) or MCP.

Settings flow one way: flags → ``settings_from_flags`` → the run context's runtime (LM) → ``dspy.configure``;
the memory is the run context's (``RunContext.memory``).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

import click

from nemori_dspy.apps.cli.options import MEMORY_SETTINGS, compose, configure_logging, db_option, setting_options, verbose_option
from nemori_dspy.apps.context import RunContext

__all__ = ["serve", "memory_options", "open_memory", "server_token", "trace_option", "SERVE_SETTINGS"]


def memory_options() -> Any:
    """The flags ``serve`` and the memory commands share: ``--db``, the settings flags of ``MEMORY_SETTINGS``,
    ``-v``."""
    return compose(
        db_option("SQLite store file (default: $NEMORI_DB_PATH, else ~/.cache/nemori-dspy/memory.sqlite3)",
                  dest="db_path"),
        setting_options(MEMORY_SETTINGS, short_help=True),
        verbose_option("log INFO"))


def open_memory(flags: dict[str, Any], stack: ExitStack, llm: bool) -> Any:
    """Settings from ``flags`` → (the runtime, if ``llm``) → ``Memory``; everything is closed with ``stack``.

    Raises:
        ConfigError: an invalid setting, or a store / embedder that cannot be opened.
    """
    ctx = RunContext.from_flags(flags, MEMORY_SETTINGS)
    stage_lms = None
    if llm:
        rt = stack.enter_context(ctx.runtime())
        stage_lms = rt.stage_lms
    memory = ctx.memory(stage_lms)
    stack.callback(memory.store.close)
    return memory


#: ``serve http`` / ``mcp``'s settings flags: the memory commands' and ``--trace`` (``serve_tracing``).
SERVE_SETTINGS = (*MEMORY_SETTINGS, "serve_tracing")


def trace_option() -> Any:
    """``--trace/--no-trace``: override the setting ``serve_tracing`` (MLflow traces of requests, off by default)."""
    return click.option("--trace/--no-trace", "serve_tracing", default=None,
                        help="trace each request's LLM calls into MLflow (experiment <mlflow_experiment>-serve; "
                             "traces hold users' messages) (default: setting serve_tracing, off; env "
                             "NEMORI_SERVE_TRACING)")


def server_token(settings: Any) -> str | None:
    """The server's bearer token (``NEMORI_API_TOKEN``), or None when the API is open (loopback only)."""
    return settings.api_token.get_secret_value() if settings.api_token else None


@click.group("serve", help="serve memory to agents over HTTP (REST) or MCP")
def serve() -> None:
    """``serve``: ``http``, ``mcp`` and ``token``."""


@serve.command("http", help="REST API with OpenAPI docs at /docs (FastAPI + uvicorn)")
@memory_options()
@trace_option()
@click.option("--host", default="127.0.0.1", help="bind address (non-loopback needs NEMORI_API_TOKEN)")
@click.option("--port", type=int, default=8765)
@click.option("--threads", type=int, default=2, help="users processed at once in the background (0 = store only)")
@click.option("--max-body-bytes", type=int, default=None, help="largest request body (default 8 MiB)")
@click.option("--max-messages", type=int, default=None, help="messages per request (default 10000)")
@click.option("--max-message-chars", type=int, default=None, help="characters per message (default 32000)")
def serve_http(**flags: Any) -> int:
    """``serve http``: the FastAPI app on uvicorn, with a background processor of ``--threads`` users."""
    import uvicorn

    from nemori_dspy.apps.serving.http import Limits, check_bind, create_app
    from nemori_dspy.apps.serving.tracing import serve_tracer
    from nemori_dspy.apps.serving.worker import BackgroundProcessor

    settings = RunContext.from_flags(flags, SERVE_SETTINGS).settings
    token = server_token(settings)
    host, port = flags["host"], flags["port"]
    check_bind(host, token)  # before any model starts
    limits = Limits(**{k: flags[k] for k in ("max_body_bytes", "max_messages", "max_message_chars")
                       if flags[k] is not None})
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=True)
        tracer = stack.enter_context(serve_tracer(settings))
        app = create_app(memory, BackgroundProcessor(memory, threads=flags["threads"], tracer=tracer), token=token,
                         limits=limits)
        auth = "bearer token required" if token else "NO AUTH (loopback only)"
        print(f"nemori-dspy HTTP API on http://{host}:{port} (docs /docs; {auth})", file=sys.stderr, flush=True)
        uvicorn.run(app, host=host, port=port, log_level="info" if flags["verbose"] else "warning")
    return 0


@serve.command("mcp", help="MCP server (stdio; --http for streamable HTTP)")
@memory_options()
@trace_option()
@click.option("--user", default=None, help="act for this user only (tools then take no user_id)")
@click.option("--http", is_flag=True, help="streamable HTTP at http://HOST:PORT/mcp instead of stdio")
@click.option("--host", default="127.0.0.1")
@click.option("--port", type=int, default=8766)
@click.option("--threads", type=int, default=1, help="users processed at once in the background (0 = store only)")
def serve_mcp(**flags: Any) -> int:
    """``serve mcp``: the MCP server on stdio, or streamable HTTP with ``--http`` (bearer tokens verified by the
    SDK when ``NEMORI_API_TOKEN`` is set); ``remember`` queues on a background worker of ``--threads`` users,
    which resumes stored work on start and stops after the current window on exit."""
    from nemori_dspy.apps.serving.http import check_bind
    from nemori_dspy.apps.serving.mcp import build_mcp_server
    from nemori_dspy.apps.serving.tracing import serve_tracer
    from nemori_dspy.apps.serving.worker import BackgroundProcessor

    settings = RunContext.from_flags(flags, SERVE_SETTINGS).settings
    token = server_token(settings)
    host, port = flags["host"], flags["port"]
    if flags["http"]:
        check_bind(host, token)
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=True)
        tracer = stack.enter_context(serve_tracer(settings))
        processor = BackgroundProcessor(memory, threads=flags["threads"], tracer=tracer)
        stack.callback(processor.stop)
        processor.start(resume=True)
        server = build_mcp_server(memory, user=flags["user"], processor=processor,
                                  token=token if flags["http"] else None,
                                  issuer_url=f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}",
                                  tracer=tracer)
        if not flags["http"]:
            server.run("stdio")
            return 0
        import uvicorn

        app = server.streamable_http_app(host=host)
        auth = "bearer token required" if token else "NO AUTH (loopback only)"
        print(f"nemori-dspy MCP (streamable HTTP) on http://{host}:{port}/mcp ({auth})", file=sys.stderr, flush=True)
        uvicorn.run(app, host=host, port=port, log_level="info" if flags["verbose"] else "warning")
    return 0


@serve.command("token", help="print the bearer token that opens only one user's memory (REST routes, MCP tools)")
@click.option("--user", required=True)
def serve_token(user: str) -> int:
    """``serve token``: the per-user token derived from the server's ``NEMORI_API_TOKEN``.

    Raises:
        ConfigError: no server token is set.
    """
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.memory import validate_user_id
    from nemori_dspy.apps.serving.auth import user_token

    configure_logging(False)
    token = server_token(RunContext.from_flags({}, ()).settings)
    if not token:
        raise ConfigError("no server token to derive from. Fix: export NEMORI_API_TOKEN=<the server's token>.")
    print(user_token(token, validate_user_id(user)))
    return 0
