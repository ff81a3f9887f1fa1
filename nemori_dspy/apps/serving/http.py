"""REST API over ``Memory`` (FastAPI; served by uvicorn via ``nemori-dspy serve http``).

Routes live under ``/v1``; the user id is a path segment, so every route reads and writes one
user's memory only (records are looked up by (user, id): another user's episode id is a 404).
OpenAPI docs: ``/docs`` and ``/openapi.json``.

The routes are grouped in ``APIRouter``s by tag (``ROUTERS``); handlers get the served memory, worker
and limits through dependency functions (``get_memory``, ``get_processor``, ``get_limits``) that read
the app's ``Served`` (``app.state.served``), and ``authorize`` / ``user_path`` guard every user route.
``create_app`` builds one app and mounts the routers.

Auth: ``Authorization: Bearer <token>``. The server token (``NEMORI_API_TOKEN``) opens every
route; a *user token* (``user_token(server_token, user_id)``, printed by ``nemori-dspy serve token
--user U``) opens only ``/v1/users/U/...``, for handing to an agent that acts for one user.
Without a server token the API is open, which is allowed on a loopback host only
(``check_bind``).

Adding messages stores them durably and returns at once (202) with the pending count; a
``BackgroundProcessor`` builds memory per user, in order. Limits: request body bytes (413),
messages per request (413), characters per message (422); malformed input is a 422 naming the
field and the fix.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, AsyncIterator, Callable

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from ...errors import (ConfigError, InvalidInputError, LLMError, NemoriError, NotFoundError, StoreError,
                      UnknownUserError)
from ...memory import Memory, validate_user_id
from ...tools import search_payload
from ...types import MetadataValue
from .auth import user_token
from .worker import BackgroundProcessor

__all__ = ["create_app", "Limits", "check_bind", "user_token", "ROUTERS", "Served", "served", "get_memory",
           "get_processor", "get_limits", "authorize", "user_path"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Request limits: ``max_body_bytes`` (413), ``max_messages`` per request (413),
    ``max_message_chars`` per message content (422), ``max_query_chars`` for search/answer (422)."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_messages: int = 10_000
    max_message_chars: int = 32_000
    max_query_chars: int = 4_000


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve without a token on anything but a loopback host.

    Raises:
        ConfigError: ``host`` is not loopback (127.0.0.0/8, ::1, localhost) and ``token`` is empty.
    """
    if token:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"refusing to serve on {host!r} without a token: anyone who can reach it could read "
                          "every user's memory. Fix: export NEMORI_API_TOKEN=<a long random secret> "
                          "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or bind 127.0.0.1.")


# --------------------------------------------------------------------------- request bodies
class MessageIn(BaseModel):
    """One message to remember."""

    model_config = ConfigDict(extra="forbid")
    speaker: str = Field(min_length=1, description="who said it: a name or a role such as 'user'")
    content: str = Field(description="the message text; must not be blank")
    timestamp: str = Field(description="when it was said, ISO 8601 (e.g. 2023-05-08T13:56:00) or "
                           "'1:56 pm on 8 May, 2023'")
    id: str | None = Field(default=None, description="your message id (re-sending it is a no-op); "
                           "default: a hash of speaker, timestamp and content")
    metadata: dict[str, MetadataValue] | None = Field(default=None, description="flat tags, e.g. {'session': 's1'}; "
                                                      "usable as a search filter")


class AddMessagesIn(BaseModel):
    messages: list[MessageIn] = Field(description="messages in the order they were said")


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(description="what to look for")
    top_k: int | None = Field(default=None, ge=0, le=100, description="episodes to return (default 10)")
    semantic_top_k: int | None = Field(default=None, ge=0, le=200, description="semantic entries (default 20)")
    metadata: dict[str, MetadataValue] | None = Field(default=None, description="only episodes holding a message "
                                                      "with all these metadata pairs")


class SemanticUpdateIn(BaseModel):
    """A user's correction of a fact: recorded as its new version (the old one is retired, ``user_update``)."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, description="the corrected statement, e.g. 'Alice lives in Berlin.'")
    event_start: str | None = Field(default=None, description="when what it states began, ISO 8601; default: the "
                                    "old version's event span")
    event_end: str | None = Field(default=None, description="when it ended, ISO 8601 (one bound alone sets both)")


class AnswerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(description="a question about the user or past conversations")


# --------------------------------------------------------------------------- errors
def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"message": message, **extra}}, status_code=status)


_STATUS: list[tuple[type, int]] = [(InvalidInputError, 422), (UnknownUserError, 404), (NotFoundError, 404),
                                   (StoreError, 503), (LLMError, 502), (NemoriError, 500)]


def _nemori_error(_: Request, exc: NemoriError) -> JSONResponse:
    status = next(code for cls, code in _STATUS if isinstance(exc, cls))
    extra = {"field": exc.field} if isinstance(exc, InvalidInputError) else {}
    return _error(status, str(exc), **extra)


def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    loc = [p for p in first.get("loc", ()) if p != "body"]
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))
    return _error(422, f"{field or 'body'}: {first.get('msg')}. Fix: see the request schema at /docs",
                  field=field or "body", errors=len(errs))


class _BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` (declared or streamed) is a 413 before any handler runs."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(scope, receive, send)
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reject(scope, receive, send)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: dict, receive: Callable, send: Callable) -> None:
        resp = _error(413, f"request body is larger than {self.max_bytes} bytes. Fix: send fewer messages per "
                      "request (split the batch), or raise the server's --max-body-bytes")
        await resp(scope, receive, send)


# --------------------------------------------------------------------------- dependencies
@dataclass(frozen=True)
class Served:
    """What one app serves, kept on ``app.state.served``: read by the dependency functions below."""

    memory: Memory
    processor: BackgroundProcessor
    token: str | None
    limits: Limits


def served(request: Request) -> Served:
    """Dependency: the ``Served`` of the app handling ``request``."""
    return request.app.state.served


def get_memory(request: Request) -> Memory:
    """Dependency: the served ``Memory``."""
    return served(request).memory


def get_processor(request: Request) -> BackgroundProcessor:
    """Dependency: the background worker over the served memory."""
    return served(request).processor


def get_limits(request: Request) -> Limits:
    """Dependency: the app's request limits."""
    return served(request).limits


_bearer = HTTPBearer(auto_error=False, description="server token (NEMORI_API_TOKEN) or a per-user token")


def authorize(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """Dependency: pass with the server token, or with the user token of the path's ``user_id``.

    Raises:
        an auth error the app answers with 401 (missing or wrong token) or 403 (a user token on another
        user's route), with ``WWW-Authenticate: Bearer``.
    """
    token = served(request).token
    if not token:
        return
    given = cred.credentials if cred is not None else ""
    if hmac.compare_digest(given.encode(), token.encode()):
        return
    user = request.path_params.get("user_id")
    if user is not None and given.startswith("nu_") and hmac.compare_digest(given, user_token(token, user)):
        return
    code, why = ((403, "this token is for another user") if given.startswith("nu_") and user is not None
                 else (401, "missing or wrong bearer token"))
    raise _AuthError(code, why)


def user_path(user_id: str = Path(description="the user whose memory this is (1-256 characters, no "
                                              "control characters, no '/')")) -> str:
    """Dependency: the path's ``user_id``, validated (``InvalidInputError`` → 422)."""
    return validate_user_id(user_id)


MemoryDep = Annotated[Memory, Depends(get_memory)]
ProcessorDep = Annotated[BackgroundProcessor, Depends(get_processor)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
UserId = Annotated[str, Depends(user_path)]
_AUTH = [Depends(authorize)]


def _public(model: BaseModel) -> dict[str, Any]:
    """A record as JSON without its embedding vector."""
    return model.model_dump(mode="json", exclude={"vector"})


def _user_status(memory: Memory, processor: BackgroundProcessor, user_id: str) -> dict[str, Any]:
    # counters are the whole memory's figures (all users): not one user's business
    st = memory.status(user_id).model_dump(exclude={"counters"})
    return {**st, **processor.state(user_id).model_dump()}


# --------------------------------------------------------------------------- routers
server_router = APIRouter(prefix="/v1", tags=["server"])


@server_router.get("/health")
def health() -> dict[str, Any]:
    """Liveness: no auth, no user data."""
    return {"ok": True}


@server_router.get("/status", dependencies=_AUTH)
def server_status(processor: ProcessorDep, limits: LimitsDep) -> dict[str, Any]:
    """Worker figures (no user ids or counts of other users' data)."""
    return {"ok": True, "worker": processor.summary().model_dump(), "limits": limits.__dict__}


messages_router = APIRouter(prefix="/v1/users/{user_id}", tags=["messages"], dependencies=_AUTH)


@messages_router.post("/messages", status_code=202)
def add_messages(body: AddMessagesIn, user_id: UserId, memory: MemoryDep, processor: ProcessorDep,
                 limits: LimitsDep) -> dict[str, Any]:
    """Store messages durably (idempotent on message id) and return at once; memory is built in
    the background, in order. 202 with ``accepted``, ``duplicates``, ``ids``, ``duplicate_ids``, ``pending``."""
    if len(body.messages) > limits.max_messages:
        raise _TooMany(len(body.messages), limits.max_messages)
    for i, m in enumerate(body.messages):
        if len(m.content) > limits.max_message_chars:
            raise InvalidInputError(f"messages[{i}].content", f"is {len(m.content)} characters, more than "
                                    f"{limits.max_message_chars}", "split the message or shorten it")
    rows = [m.model_dump(exclude_none=True) for m in body.messages]
    res = memory.add_messages(user_id, rows, process=False)
    if res.pending:
        processor.schedule(user_id)
    return res.model_dump(exclude={"report"})


@messages_router.post("/flush", status_code=202)
def flush(user_id: UserId, memory: MemoryDep, processor: ProcessorDep,
          wait: bool = Query(False, description="wait until processing is done (up to timeout_s)"),
          timeout_s: float = Query(300.0, gt=0, le=3600)) -> dict[str, Any]:
    """Process every buffered message, even a partial window (end of a conversation), in the background."""
    if not memory.store.user_exists(user_id):
        raise UnknownUserError(user_id)
    scheduled = processor.schedule(user_id, force=True)
    done = processor.wait_idle(user_id, timeout_s) if wait and scheduled else False
    return {"scheduled": scheduled, "done": done, **_user_status(memory, processor, user_id)}


@messages_router.delete("/messages/{message_id}")
def delete_message(message_id: str, user_id: UserId, memory: MemoryDep, processor: ProcessorDep) -> dict[str, Any]:
    """Forget one message and what was derived from it only; the rest of its episode is re-processed."""
    out = memory.delete_message(user_id, message_id)
    if out.requeued:
        processor.schedule(user_id)
    return {"deleted": message_id, **out.model_dump()}


users_router = APIRouter(prefix="/v1/users/{user_id}", tags=["users"], dependencies=_AUTH)


@users_router.get("/status")
def user_status(user_id: UserId, memory: MemoryDep, processor: ProcessorDep) -> dict[str, Any]:
    """Counts (messages, pending, episodes, semantic, to_distill), parked work and processing state."""
    return _user_status(memory, processor, user_id)


@users_router.delete("")
def delete_user(user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    """Delete everything stored for the user."""
    memory.delete_user(user_id)
    return {"deleted": user_id}


query_router = APIRouter(prefix="/v1/users/{user_id}", tags=["query"], dependencies=_AUTH)


@query_router.post("/search")
def search(body: SearchIn, user_id: UserId, memory: MemoryDep, processor: ProcessorDep,
           limits: LimitsDep) -> dict[str, Any]:
    """Top-k episodes and semantic entries by similarity (an unknown user gets empty lists)."""
    _check_query("query", body.query, limits)
    with processor.dspy_context(), processor.traced("search", operation="search", user_id=user_id):
        res = memory.search(user_id, body.query, body.top_k, body.semantic_top_k, body.metadata)
    return search_payload(res, chars=limits.max_message_chars)


@query_router.post("/answer")
def answer(body: AnswerIn, user_id: UserId, memory: MemoryDep, processor: ProcessorDep,
           limits: LimitsDep) -> dict[str, Any]:
    """Answer a question from the user's memory (one LLM call)."""
    _check_query("question", body.question, limits)
    with processor.dspy_context(), processor.traced("answer", operation="answer", user_id=user_id):
        res = memory.answer(user_id, body.question)
    return {"answer": res.answer, "context": res.context, "retrieved": search_payload(res.retrieved),
            "usage": res.usage.model_dump()}


episodes_router = APIRouter(prefix="/v1/users/{user_id}/episodes", tags=["episodes"], dependencies=_AUTH)


@episodes_router.get("")
def list_episodes(user_id: UserId, memory: MemoryDep, offset: int = Query(0, ge=0),
                  limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    """Live episodes, oldest first, with their raw messages."""
    eps = memory.list_episodes(user_id)
    return {"total": len(eps), "episodes": [_public(e) for e in eps[offset:offset + limit]]}


@episodes_router.get("/{episode_id}")
def get_episode(episode_id: str, user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    return _public(memory.get_episode(user_id, episode_id))


@episodes_router.delete("/{episode_id}")
def delete_episode(episode_id: str, user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    """Delete one episode (its messages are kept, not re-buffered)."""
    memory.delete_episode(user_id, episode_id)
    return {"deleted": episode_id}


semantic_router = APIRouter(prefix="/v1/users/{user_id}/semantic", tags=["semantic"], dependencies=_AUTH)


@semantic_router.get("")
def list_semantic(user_id: UserId, memory: MemoryDep, offset: int = Query(0, ge=0),
                  limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    """Live semantic entries, oldest first."""
    entries = memory.list_semantic(user_id)
    return {"total": len(entries), "semantic": [_public(e) for e in entries[offset:offset + limit]]}


@semantic_router.get("/{entry_id}")
def get_semantic(entry_id: str, user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    return _public(memory.get_semantic(user_id, entry_id))


@semantic_router.patch("/{entry_id}")
def update_semantic(entry_id: str, body: SemanticUpdateIn, user_id: UserId, memory: MemoryDep,
                    limits: LimitsDep) -> dict[str, Any]:
    """Correct a fact: the text becomes a new version (new id, same source episodes, the old event span unless
    given); the old version is retired with the decision ``user_update`` and stays readable in its history."""
    if len(body.text) > limits.max_message_chars:
        raise InvalidInputError("text", f"is {len(body.text)} characters, more than {limits.max_message_chars}",
                                "state the fact shorter")
    new = memory.update_semantic(user_id, entry_id, body.text, body.event_start, body.event_end)
    return {"entry": _public(new), "retired": entry_id, "decision": "user_update"}


@semantic_router.get("/{entry_id}/history")
def semantic_history(entry_id: str, user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    """Every version of a fact, oldest first (``entry_id`` live or retired): text, event span, ``created_at``,
    ``origin``, ``live`` and, once retired, ``retired_at``, ``retired_by`` and ``retired_decision`` (merge,
    conflict or user_update)."""
    return {"entry_id": entry_id, "versions": [_public(v) for v in memory.semantic_history(user_id, entry_id)]}


@semantic_router.delete("/{entry_id}")
def delete_semantic(entry_id: str, user_id: UserId, memory: MemoryDep) -> dict[str, Any]:
    """Delete the entry only; ``source_episodes`` still hold what it said (use ``/forget`` to remove them)."""
    return {"deleted": entry_id, "source_episodes": memory.delete_semantic(user_id, entry_id)}


@semantic_router.post("/{entry_id}/forget")
def forget_semantic(entry_id: str, user_id: UserId, memory: MemoryDep, processor: ProcessorDep) -> dict[str, Any]:
    """Forget a fact everywhere: the entry, its source episodes' raw messages and the episodes holding
    them; their other messages are re-processed."""
    out = memory.forget(user_id, entry_id)
    if out.requeued:
        processor.schedule(user_id)
    return {"forgotten": entry_id, **out.model_dump()}


#: every router of the API, in the order they are mounted.
ROUTERS = (server_router, messages_router, users_router, query_router, episodes_router, semantic_router)


# --------------------------------------------------------------------------- the app
def create_app(memory: Memory, processor: BackgroundProcessor, token: str | None = None,
               limits: Limits = Limits(), resume: bool = True) -> FastAPI:
    """The FastAPI app. ``processor`` is started (resuming stored work if ``resume``) and stopped
    with the app's lifespan.

    Args:
        memory: the ``Memory`` served.
        processor: background worker over the same memory.
        token: server bearer token; None/empty = no auth (loopback only, see ``check_bind``).
        limits: request limits.
        resume: on start, schedule every user with stored pending work.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        processor.start(resume=resume)
        try:
            yield
        finally:
            processor.stop()

    app = FastAPI(title="nemori-dspy memory API", version="1", lifespan=lifespan,
                  description="Long-term memory for agents (Nemori as a DSPy pipeline). Authenticate with "
                              "`Authorization: Bearer <token>`.",
                  exception_handlers={NemoriError: _nemori_error, RequestValidationError: _validation_error,
                                      _AuthError: _auth_error, _TooMany: _too_many})
    app.state.served = Served(memory=memory, processor=processor, token=token, limits=limits)
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _check_query(field: str, text: str, limits: Limits) -> None:
    if len(text) > limits.max_query_chars:
        raise InvalidInputError(field, f"is {len(text)} characters, more than {limits.max_query_chars}",
                                "ask a shorter question")


class _AuthError(Exception):
    def __init__(self, status: int, why: str) -> None:
        self.status, self.why = status, why


class _TooMany(Exception):
    def __init__(self, n: int, cap: int) -> None:
        self.n, self.cap = n, cap


def _auth_error(_: Request, exc: _AuthError) -> JSONResponse:
    resp = _error(exc.status, f"{exc.why}. Fix: send 'Authorization: Bearer <token>' with the server token "
                  "(NEMORI_API_TOKEN) or this user's token")
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _too_many(_: Request, exc: _TooMany) -> JSONResponse:
    return _error(413, f"{exc.n} messages in one request, more than {exc.cap}. Fix: split the batch "
                  f"into requests of at most {exc.cap} messages", field="messages")
