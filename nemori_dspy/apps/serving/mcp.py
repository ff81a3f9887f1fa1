"""MCP server over ``Memory`` (official ``mcp`` SDK, v2 ``MCPServer``): stdio by default, streamable
HTTP with ``nemori-dspy serve mcp --http``.

Tools (the same operations as ``nemori_dspy.tools``): ``remember``, ``search_memory``,
``answer_from_memory``, ``forget``. Each takes ``user_id`` explicitly, unless the server was started
for one user (``--user U``), in which case the argument does not exist and every call acts on U.
Errors come back as MCP tool errors whose text names the field and the fix.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ...errors import NemoriError
from ...memory import Memory, validate_user_id
from ...tools import MemoryMessage, MemoryOps

__all__ = ["build_mcp_server", "bearer_guard"]

INSTRUCTIONS = ("Long-term memory of users (Nemori). Call remember with what the user said or asked you to keep, "
                "search_memory or answer_from_memory before answering questions about the user's past, and "
                "forget with an id from search_memory when the user asks you to forget something.")


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking memory call in a worker thread; a ``NemoriError`` becomes a tool error."""
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))
    except NemoriError as exc:
        raise ToolError(str(exc)) from exc


def build_mcp_server(memory: Memory, user: str | None = None, flush_on_remember: bool = True,
                     tracer: Any = None) -> MCPServer:
    """The MCP server: four memory tools, ``user_id`` per call or fixed to ``user``; with ``tracer``
    (``serving.tracing.ServeTracer``) every tool call is one MLflow trace.

    Raises:
        InvalidInputError: ``user`` is a malformed user id.
    """
    from .tracing import traced_ops

    ops = traced_ops(MemoryOps(memory, flush_on_remember=flush_on_remember), tracer)
    server = MCPServer(name="nemori-dspy", instructions=INSTRUCTIONS)
    if user is not None:
        _fixed_user_tools(server, ops, validate_user_id(user))
    else:
        _per_call_tools(server, ops)
    return server


def _per_call_tools(server: MCPServer, ops: MemoryOps) -> None:
    @server.tool()
    async def remember(user_id: str, messages: list[MemoryMessage]) -> dict[str, Any]:
        """Save messages or facts to a user's long-term memory, for recall in later sessions. Each
        message: {"content": ..., "speaker": "user"}, optional "timestamp" (ISO 8601), "id", "metadata"."""
        return await _off_loop(ops.remember, user_id, messages)

    @server.tool()
    async def search_memory(user_id: str, query: str, top_k: int = 5) -> dict[str, Any]:
        """Search a user's long-term memory: best-matching episodes (id, cue, narrative, dates) and
        semantic facts (id, text), best first."""
        return await _off_loop(ops.search, user_id, query, top_k)

    @server.tool()
    async def answer_from_memory(user_id: str, question: str) -> dict[str, Any]:
        """Answer a question about a user or their past conversations from long-term memory."""
        return await _off_loop(ops.answer, user_id, question)

    @server.tool()
    async def forget(user_id: str, entry_id: str) -> dict[str, Any]:
        """Delete one memory entry of a user by id (a fact 'sem_...', an episode 'ep_...' or a message
        id), e.g. when the user asks to forget something. Ids come from search_memory."""
        return await _off_loop(ops.forget, user_id, entry_id)


def _fixed_user_tools(server: MCPServer, ops: MemoryOps, user: str) -> None:
    @server.tool()
    async def remember(messages: list[MemoryMessage]) -> dict[str, Any]:
        """Save messages or facts to the user's long-term memory, for recall in later sessions. Each
        message: {"content": ..., "speaker": "user"}, optional "timestamp" (ISO 8601), "id", "metadata"."""
        return await _off_loop(ops.remember, user, messages)

    @server.tool()
    async def search_memory(query: str, top_k: int = 5) -> dict[str, Any]:
        """Search the user's long-term memory: best-matching episodes (id, cue, narrative, dates) and
        semantic facts (id, text), best first."""
        return await _off_loop(ops.search, user, query, top_k)

    @server.tool()
    async def answer_from_memory(question: str) -> dict[str, Any]:
        """Answer a question about the user or their past conversations from long-term memory."""
        return await _off_loop(ops.answer, user, question)

    @server.tool()
    async def forget(entry_id: str) -> dict[str, Any]:
        """Delete one memory entry by id (a fact 'sem_...', an episode 'ep_...' or a message id), e.g.
        when the user asks to forget something. Ids come from search_memory."""
        return await _off_loop(ops.forget, user, entry_id)


def bearer_guard(app: Any, token: str) -> Callable:
    """ASGI wrapper for the streamable-HTTP app: every HTTP request needs ``Authorization: Bearer <token>``
    (401 otherwise)."""
    import hmac

    from starlette.responses import JSONResponse

    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                resp = JSONResponse({"error": {"message": "missing or wrong bearer token. Fix: send "
                                               "'Authorization: Bearer <NEMORI_API_TOKEN>'"}}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, send)
        await app(scope, receive, send)

    return guarded
