"""MCP server over ``Memory`` (official ``mcp`` SDK, v2 ``MCPServer``): stdio by default, streamable
HTTP with ``nemori-dspy serve mcp --http``.

Tools (``nemori_dspy.tools.MemoryOps``): ``remember``, ``search_memory``, ``answer_from_memory``, ``forget``,
``list_memories``, ``memory_status`` and ``delete_all_memories``. Each takes ``user_id`` explicitly, unless the
server was started for one user (``--user U``), in which case the argument does not exist and every call acts on
U. Every tool carries MCP ``ToolAnnotations``: the reading ones ``readOnlyHint``, ``forget`` and
``delete_all_memories`` ``destructiveHint`` (the latter also needs ``confirm`` = the user id).

``remember`` stores the messages durably and returns at once; a ``BackgroundProcessor`` (the REST server's worker)
builds memory from them per user, in order, and ``memory_status`` shows ``processing`` until it is done.

Auth over streamable HTTP is the SDK's bearer-token verification (``NemoriTokenVerifier``): the server token
(``NEMORI_API_TOKEN``) opens every user; a per-user token (``nemori-dspy serve token --user U``, the REST API's)
opens only U: a tool call naming another user is refused, and a ``--user U`` server admits no other user's
token at all (401). Errors come back as MCP tool errors whose text names the field and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect
from typing import Annotated, Any, Callable, Literal

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from ...errors import NemoriError
from ...memory import Memory, validate_user_id
from ...tools import MemoryMessage, MemoryOps
from ...types import MetadataValue
from .auth import is_user_token, token_opens
from .tracing import traced_ops
from .worker import BackgroundProcessor

__all__ = ["build_mcp_server", "NemoriTokenVerifier", "TOOL_ANNOTATIONS", "SCOPE_ALL_USERS", "SCOPE_ONE_USER"]

INSTRUCTIONS = ("Long-term memory of users (Nemori). Call remember with what the user said or asked you to keep "
                "(it returns at once; memory_status shows when it is searchable), search_memory or "
                "answer_from_memory before answering questions about the user's past, list_memories to see what is "
                "kept, and forget with an id from search_memory or list_memories when the user asks you to forget "
                "something. delete_all_memories erases everything of a user: only on the user's explicit request.")

#: scope of the server token (every user) and of a per-user token (the one user it was made for).
SCOPE_ALL_USERS, SCOPE_ONE_USER = "nemori:all-users", "nemori:one-user"

_READ = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
#: the MCP tool annotations of each tool (hints for clients: which tools only read, which destroy memory).
TOOL_ANNOTATIONS: dict[str, ToolAnnotations] = {
    "remember": ToolAnnotations(title="Remember", readOnlyHint=False, destructiveHint=False, idempotentHint=False,
                                openWorldHint=False),
    "search_memory": _READ.model_copy(update={"title": "Search memory"}),
    "answer_from_memory": _READ.model_copy(update={"title": "Answer from memory"}),
    "list_memories": _READ.model_copy(update={"title": "List memories"}),
    "memory_status": _READ.model_copy(update={"title": "Memory status"}),
    "forget": ToolAnnotations(title="Forget", readOnlyHint=False, destructiveHint=True, idempotentHint=True,
                              openWorldHint=False),
    "delete_all_memories": ToolAnnotations(title="Delete all memories", readOnlyHint=False, destructiveHint=True,
                                           idempotentHint=True, openWorldHint=False),
}

UserId = Annotated[str, Field(description="the user whose memory this is: a stable id such as 'alice' or a UUID")]
Metadata = Annotated[dict[str, MetadataValue] | None,
                     Field(description="only episodes holding a message tagged with all these pairs (e.g. "
                                       "{'agent_id': 'planner'} or {'run_id': 'r42'}) and the facts distilled from "
                                       "them; omitted: everything")]


class NemoriTokenVerifier:
    """The SDK's ``TokenVerifier`` over nemori's bearer tokens (``apps.serving.auth``).

    The server token gets scope ``SCOPE_ALL_USERS``; a well-formed per-user token gets ``SCOPE_ONE_USER`` (which user
    it opens is checked per tool call, against the ``user_id`` the call names, since the token does not say).
    With ``user`` (a ``--user U`` server) only U's token is admitted. Each token is its own principal
    (``client_id``), so a session opened with one token cannot be continued with another.

    Args:
        server_token: ``NEMORI_API_TOKEN``.
        user: the one user the server acts for, or None.
    """

    def __init__(self, server_token: str, user: str | None = None) -> None:
        if not server_token:
            raise ValueError("a token verifier needs the server token")
        self.server_token, self.user = server_token, user

    async def verify_token(self, token: str) -> AccessToken | None:
        """``AccessToken`` for the server token or an admissible user token; None (401) for anything else."""
        principal = "nemori-" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self.server_token.encode()):
            return AccessToken(token=token, client_id=principal, scopes=[SCOPE_ALL_USERS])
        if is_user_token(token) and (self.user is None or token_opens(self.server_token, token, self.user)):
            return AccessToken(token=token, client_id=principal, scopes=[SCOPE_ONE_USER])
        return None


def _authorize(server_token: str | None, user_id: str) -> str:
    """``user_id`` validated, if the request's bearer token opens it (no token checked: stdio, or an open HTTP
    server on loopback). Raises ``ToolError`` otherwise."""
    try:
        validate_user_id(user_id)
    except NemoriError as exc:
        raise ToolError(str(exc)) from exc
    access = get_access_token()
    if access is None or server_token is None or SCOPE_ALL_USERS in access.scopes:
        return user_id
    if token_opens(server_token, access.token, user_id):
        return user_id
    raise ToolError("user_id: this token is for another user. Fix: call with the user id the token was made for "
                    "(nemori-dspy serve token --user <id>), or use the server token")


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking memory call in a worker thread; a ``NemoriError`` becomes a tool error."""
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))
    except NemoriError as exc:
        raise ToolError(str(exc)) from exc


def build_mcp_server(memory: Memory, user: str | None = None, flush_on_remember: bool = True,
                     processor: BackgroundProcessor | None = None, token: str | None = None,
                     issuer_url: str = "http://127.0.0.1", tracer: Any = None) -> MCPServer:
    """The MCP server: seven memory tools, ``user_id`` per call or fixed to ``user``; with ``tracer``
    (``serving.tracing.ServeTracer``) every tool call is one MLflow trace.

    Args:
        memory: the memory served.
        user: act for this user only (the tools then take no ``user_id``).
        flush_on_remember: ``remember`` also processes a partial window, so what an agent chose to keep is
            searchable in its next session (default).
        processor: the background worker ``remember`` queues on (started and stopped by the caller, as
            ``nemori-dspy serve mcp`` does); None: a one-thread ``BackgroundProcessor`` of its own, never resumed
            or stopped (its idle thread ends with the process).
        token: the server token; given, streamable HTTP verifies every request's bearer token through the SDK
            (``NemoriTokenVerifier``) and the tools check the user a per-user token opens. None: no auth (stdio,
            or HTTP on a loopback host: ``http.check_bind``).
        issuer_url: this server's own base URL (the SDK's ``AuthSettings`` needs one; no OAuth routes are served).
        tracer: a ``serving.tracing.ServeTracer`` (``serve_tracing``), or None: no traces.
    Raises:
        InvalidInputError: ``user`` is a malformed user id.
    """
    fixed = validate_user_id(user) if user is not None else None
    processor = processor if processor is not None else BackgroundProcessor(memory, threads=1)
    ops = traced_ops(MemoryOps(memory, flush_on_remember=flush_on_remember, processor=processor), tracer)
    auth = {}
    if token:
        auth = {"token_verifier": NemoriTokenVerifier(token, fixed),
                "auth": AuthSettings(issuer_url=issuer_url, resource_server_url=None)}
    server = MCPServer(name="nemori-dspy", instructions=INSTRUCTIONS, **auth)
    for fn in _tools(ops, token or None):
        server.add_tool(fn if fixed is None else _for_user(fn, fixed), name=fn.__name__,
                        annotations=TOOL_ANNOTATIONS[fn.__name__])
    return server


def _for_user(fn: Callable[..., Any], user: str) -> Callable[..., Any]:
    """``fn`` with its ``user_id`` argument fixed to ``user`` and removed from its signature (and tool schema)."""
    sig = inspect.signature(fn, eval_str=True)

    async def bound(**kwargs: Any) -> Any:
        return await fn(user_id=user, **kwargs)

    bound.__name__, bound.__doc__, bound.__module__ = fn.__name__, fn.__doc__, fn.__module__
    bound.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if n != "user_id"])  # type: ignore[attr-defined]
    bound.__annotations__ = {n: p.annotation for n, p in sig.parameters.items() if n != "user_id"}
    bound.__annotations__["return"] = sig.return_annotation
    return bound


def _tools(ops: MemoryOps, token: str | None) -> list[Callable[..., Any]]:
    """The tool functions, each taking ``user_id`` (checked against the request's token first)."""

    async def remember(user_id: UserId, messages: list[MemoryMessage]) -> dict[str, Any]:
        """Save messages or facts to the user's long-term memory, for recall in later sessions. Returns at once
        with the stored ids: memory is built from them in the background (memory_status shows processing: true
        until they are searchable). Each message: {"content": ..., "speaker": "user"}, optional "timestamp"
        (ISO 8601), "id" (re-sending an id is a no-op) and "metadata" (flat tags, e.g. {"agent_id": "planner",
        "run_id": "r42"}, usable as a search_memory filter)."""
        return await _off_loop(ops.remember, _authorize(token, user_id), messages)

    async def search_memory(user_id: UserId, query: str, top_k: int = 5, metadata: Metadata = None) -> dict[str, Any]:
        """Search the user's long-term memory: best-matching episodes (id, cue, narrative, dates) and semantic
        facts (id, text), best first; metadata narrows it to what was remembered with those tags."""
        return await _off_loop(ops.search, _authorize(token, user_id), query, top_k, metadata)

    async def answer_from_memory(user_id: UserId, question: str) -> dict[str, Any]:
        """Answer a question about the user or their past conversations from long-term memory."""
        return await _off_loop(ops.answer, _authorize(token, user_id), question)

    async def forget(user_id: UserId, entry_id: str) -> dict[str, Any]:
        """Delete one memory entry of the user by id (a fact 'sem_...', an episode 'ep_...' or a message id),
        e.g. when the user asks to forget something; a fact goes with the conversation it came from. Ids come
        from search_memory or list_memories."""
        return await _off_loop(ops.forget, _authorize(token, user_id), entry_id)

    async def list_memories(user_id: UserId, kind: Literal["semantic", "episodes"] = "semantic", offset: int = 0,
                            limit: int = 20) -> dict[str, Any]:
        """List what is kept about the user, oldest first, a page of `limit` (1-200) from `offset`, with the
        total: kind 'semantic' gives facts (id, text, event dates), 'episodes' the conversations (id, cue,
        narrative, dates, message count)."""
        return await _off_loop(ops.list_memories, _authorize(token, user_id), kind, offset, limit)

    async def memory_status(user_id: UserId) -> dict[str, Any]:
        """The user's memory status: user_id, counts (messages, pending, episodes, semantic facts), processing
        (remembered messages still being built into memory in the background), last_error, parked work and
        healthy."""
        return await _off_loop(ops.status, _authorize(token, user_id))

    async def delete_all_memories(user_id: UserId, confirm: Annotated[str, Field(
            description="the user id again, typed out exactly, to confirm (memory_status shows it)")]) -> dict[str, Any]:
        """Erase EVERYTHING stored for the user: every message, episode and fact. Irreversible. Only when the user
        explicitly asks to delete all their memory; confirm must repeat the user id, else nothing is deleted."""
        return await _off_loop(ops.delete_all, _authorize(token, user_id), confirm)

    return [remember, search_memory, answer_from_memory, forget, list_memories, memory_status, delete_all_memories]

