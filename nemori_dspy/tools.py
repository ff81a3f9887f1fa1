"""Agent-facing memory operations: ``MemoryOps`` (JSON-able results, shared by the DSPy tools and the
MCP server) and ``memory_tools(memory, user_id)`` → ``dspy.Tool`` list for ``dspy.ReAct`` & co.

The four operations an agent needs: *remember* messages, *search* memory, *answer* a question
from memory, and *forget* one entry (an episode, a semantic entry or a message); and, for the MCP server, *list*
what is stored, read a user's *status* and *delete all* of a user's memory. Every result is a plain dict
(JSON-serialisable); the DSPy tools return it as a JSON string an LM can read.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

import dspy
from pydantic import BaseModel, Field

from .errors import InvalidInputError, NemoriError, NotFoundError
from .memory import Memory, validate_user_id
from .types import MetadataValue, SearchResult

__all__ = ["MemoryMessage", "MemoryOps", "Worker", "memory_tools", "search_payload"]


class Worker(Protocol):
    """What ``MemoryOps`` needs of a background worker (``apps.serving.worker.BackgroundProcessor`` is one)."""

    def schedule(self, user_id: str, force: bool = False) -> bool:
        """Ask for a processing pass of the user (``force``: also a partial window); False if none will run."""

    def state(self, user_id: str) -> BaseModel:
        """The user's processing state: ``processing``, ``last_error``, ``passes``."""


#: Longest text of one search hit handed to an agent (characters); the full record stays readable by id.
HIT_CHARS = 600


class MemoryMessage(BaseModel):
    """One message an agent asks to remember."""

    content: str = Field(description="what was said or what to remember (non-empty text)")
    speaker: str = Field(default="user", description="who said it, e.g. 'user', 'assistant' or a name")
    timestamp: str | None = Field(default=None, description="when it was said, ISO 8601 (e.g. 2024-05-08T13:56:00); "
                                  "omitted: now (UTC)")
    id: str | None = Field(default=None, description="a stable message id, for safe re-sending; omitted: a content hash")
    metadata: dict[str, MetadataValue] | None = Field(default=None, description="optional tags, e.g. {'session': 's1'}")


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat()


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")


def search_payload(result: SearchResult, chars: int = HIT_CHARS) -> dict[str, Any]:
    """A ``SearchResult`` as JSON-able dict: ``episodes`` (id, score, cue, narrative, start, end,
    message_ids) and ``semantic`` (id, score, text), best first, texts cut to ``chars`` characters."""
    return {
        "episodes": [{"id": h.episode.id, "score": round(h.score, 4), "cue": h.episode.cue[:chars],
                      "narrative": h.episode.narrative[:chars], "start": h.episode.start.isoformat(),
                      "end": h.episode.end.isoformat(), "message_ids": h.episode.message_ids}
                     for h in result.episodes],
        "semantic": [{"id": h.entry.id, "score": round(h.score, 4), "text": h.entry.text[:chars]}
                     for h in result.semantic],
    }


class MemoryOps:
    """The agent operations over one ``Memory``, user id explicit per call.

    Args:
        memory: the ``Memory`` to act on.
        flush_on_remember: ``remember`` also processes a partial window at once, so what an agent
            chose to remember is searchable in its next session (default). False: only full windows
            of w messages are processed; the rest waits for more messages or ``Memory.flush``.
        processor: a background worker over ``memory`` (``apps.serving.worker.BackgroundProcessor``): with one,
            ``remember`` stores the messages and returns at once, the worker building memory from them
            (``status`` shows ``processing`` until it is done); ``forget`` schedules the re-processing of
            re-buffered messages. None: ``remember`` builds memory before it returns.
    """

    def __init__(self, memory: Memory, flush_on_remember: bool = True,
                 processor: Worker | None = None) -> None:
        self.memory = memory
        self.flush_on_remember = flush_on_remember
        self.processor = processor

    def remember(self, user_id: str, messages: list[MemoryMessage | dict]) -> dict[str, Any]:
        """Store messages (idempotent on id) and build memory from them (in the background with a ``processor``).

        Returns:
            ``{"stored": [ids], "duplicates": [ids], "pending": n, "episodes": n}``; with a processor
            ``{"stored", "duplicates", "pending", "queued": bool}`` instead (``queued`` False: the worker takes
            no work, e.g. ``threads=0``; the messages stay stored for a later flush).
        Raises:
            InvalidInputError: a bad message field (nothing stored).
        """
        rows = []
        for m in messages:
            d = m.model_dump() if isinstance(m, BaseModel) else dict(m)
            d = {k: v for k, v in d.items() if v is not None}
            d.setdefault("speaker", "user")
            d.setdefault("timestamp", _now())
            rows.append(d)
        if self.processor is not None:
            res = self.memory.add_messages(user_id, rows, process=False)
            queued = bool(res.pending) and self.processor.schedule(user_id, force=self.flush_on_remember)
            return {"stored": res.ids, "duplicates": res.duplicate_ids, "pending": res.pending, "queued": queued}
        res = self.memory.add_messages(user_id, rows)
        if self.flush_on_remember and res.pending:
            self.memory.flush(user_id)
        st = self.memory.status(user_id)
        return {"stored": res.ids, "duplicates": res.duplicate_ids, "pending": st.pending,
                "episodes": st.episodes}

    def search(self, user_id: str, query: str, top_k: int = 5, metadata: dict | None = None) -> dict[str, Any]:
        """Top-``top_k`` episodes and semantic entries for ``query`` (see ``search_payload``); ``metadata`` keeps
        the episodes holding a message with all those pairs and the entries distilled from them."""
        return search_payload(self.memory.search(user_id, query, top_k=top_k, semantic_top_k=top_k, metadata=metadata))

    def status(self, user_id: str) -> dict[str, Any]:
        """One user's memory: ``user_id``, the stored counts (``messages``, ``pending``, ``episodes``,
        ``superseded_episodes``, ``semantic``, ``to_distill``), ``known``, ``parked``, ``healthy`` and, with a
        processor, ``processing`` (a background pass is queued or running), ``last_error`` and ``passes``. The
        memory's ``counters`` (all users' figures) are left out."""
        out = {"user_id": validate_user_id(user_id), **self.memory.status(user_id).model_dump(exclude={"counters"})}
        if self.processor is not None:
            out.update(self.processor.state(user_id).model_dump())
        return out

    def list_memories(self, user_id: str, kind: Literal["semantic", "episodes"] = "semantic", offset: int = 0,
             limit: int = 20) -> dict[str, Any]:
        """A page of what is stored for the user, oldest first: ``kind="semantic"`` facts (id, text, event_start,
        event_end, created_at, origin, source_episode_ids) or ``"episodes"`` (id, cue, narrative, start, end,
        message count), texts cut to ``HIT_CHARS``.

        Returns:
            ``{"kind", "total", "offset", "items": [...]}``.
        Raises:
            InvalidInputError: an unknown kind, a negative offset or a limit outside 1-200.
        """
        if kind not in ("semantic", "episodes"):
            raise InvalidInputError("kind", f"{kind!r} is not a kind of memory", "pass 'semantic' or 'episodes'")
        for name, value, low, high in (("offset", offset, 0, None), ("limit", limit, 1, 200)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
                raise InvalidInputError(name, f"{value!r} is out of range",
                                        f"pass a whole number from {low}" + (f" to {high}" if high else ""))
        if kind == "semantic":
            rows = self.memory.list_semantic(user_id)
            items = [{"id": e.id, "text": e.text[:HIT_CHARS], "event_start": _iso(e.event_start),
                      "event_end": _iso(e.event_end), "created_at": e.created_at.isoformat(), "origin": e.origin,
                      "source_episode_ids": e.source_episode_ids} for e in rows[offset:offset + limit]]
        else:
            rows = self.memory.list_episodes(user_id)
            items = [{"id": e.id, "cue": e.cue[:HIT_CHARS], "narrative": e.narrative[:HIT_CHARS],
                      "start": e.start.isoformat(), "end": e.end.isoformat(), "messages": len(e.message_ids)}
                     for e in rows[offset:offset + limit]]
        return {"kind": kind, "total": len(rows), "offset": offset, "items": items}

    def delete_all(self, user_id: str, confirm: str) -> dict[str, Any]:
        """Delete everything stored for the user, only if ``confirm`` repeats ``user_id`` exactly.

        Returns:
            ``{"deleted_user": user_id, "messages": n, "episodes": n, "semantic": n}`` (what was removed).
        Raises:
            InvalidInputError: ``confirm`` is not the user id (nothing deleted).
            UnknownUserError: nothing stored for the user.
        """
        validate_user_id(user_id)
        if confirm != user_id:
            raise InvalidInputError("confirm", "does not repeat the user id, so nothing was deleted",
                                    "only when the user asked to erase all their memory, call again with confirm set "
                                    "to the user id (memory_status shows it)")
        st = self.memory.status(user_id)
        self.memory.delete_user(user_id)
        return {"deleted_user": user_id, "messages": st.messages, "episodes": st.episodes, "semantic": st.semantic}

    def answer(self, user_id: str, question: str) -> dict[str, Any]:
        """Answer from memory: ``{"answer": str, "episode_ids": [...], "semantic_ids": [...]}``."""
        res = self.memory.answer(user_id, question)
        return {"answer": res.answer, "episode_ids": [h.episode.id for h in res.retrieved.episodes],
                "semantic_ids": [h.entry.id for h in res.retrieved.semantic]}

    def forget(self, user_id: str, entry_id: str) -> dict[str, Any]:
        """Forget one entry by id: a semantic entry (``sem_…``), an episode (``ep_…``) or a message id.

        A semantic entry is forgotten with ``Memory.forget``: the fact, the raw messages of its source
        episodes and the episodes holding them, so no answer context shows it again.

        Returns:
            ``{"deleted": "semantic"|"episode"|"message", "id": entry_id, ...}`` (a semantic entry also
            lists the ``semantic``/``episodes``/``messages`` removed and the ``requeued`` message ids; a
            message the derived ``episodes``/``semantic`` removed and the ``requeued`` ids).
        Raises:
            UnknownUserError: nothing stored for the user. NotFoundError: no such id.
        """
        out = self._remove(user_id, entry_id, lambda u, i: self.memory.forget(u, i).model_dump())
        if out.get("requeued") and self.processor is not None:
            self.processor.schedule(user_id)
        return out

    def delete(self, user_id: str, entry_id: str) -> dict[str, Any]:
        """Like ``forget``, but a semantic entry is deleted alone (``Memory.delete_semantic``; its source
        episodes, listed as ``source_episodes``, keep what it said)."""
        return self._remove(user_id, entry_id,
                            lambda u, i: {"source_episodes": self.memory.delete_semantic(u, i)})

    def _remove(self, user_id: str, entry_id: str, semantic: Any) -> dict[str, Any]:
        mem = self.memory
        attempts = [("semantic", semantic), ("episode", mem.delete_episode)]
        if entry_id.startswith("ep_"):
            attempts.reverse()
        for kind, delete in attempts:
            try:
                out = delete(user_id, entry_id)
                return {"deleted": kind, "id": entry_id, **(out or {})}
            except NotFoundError:
                continue
        try:
            return {"deleted": "message", "id": entry_id, **mem.delete_message(user_id, entry_id).model_dump()}
        except NotFoundError:
            raise NotFoundError(f"no semantic entry, episode or message {entry_id!r} for user {user_id!r}. "
                                "Fix: use an id from a search result.") from None


def _as_text(fn):
    """Run an operation; return its result as JSON, or the error's message (an LM reads both)."""
    try:
        return json.dumps(fn(), ensure_ascii=False, default=str)
    except NemoriError as exc:
        return json.dumps({"error": str(exc)}, ensure_ascii=False)


def memory_tools(memory: Memory, user_id: str, flush_on_remember: bool = True) -> list[dspy.Tool]:
    """DSPy tools bound to one user's memory: ``remember``, ``search_memory``, ``answer_from_memory``,
    ``forget``. Each takes typed arguments, has a docstring written for the LM, and returns a JSON
    string (errors as ``{"error": "...Fix: ..."}`` rather than exceptions, so an agent can recover).

    Raises:
        InvalidInputError: ``user_id`` is malformed (checked once here).
    """
    from .memory import validate_user_id

    validate_user_id(user_id)
    ops = MemoryOps(memory, flush_on_remember=flush_on_remember)

    def remember(messages: list[MemoryMessage]) -> str:
        """Save messages or facts to the user's long-term memory so they can be recalled in later
        sessions. Pass each as {"content": ..., "speaker": "user"}; timestamp (ISO 8601) is optional.
        Returns the stored ids."""
        return _as_text(lambda: ops.remember(user_id, messages))

    def search_memory(query: str, top_k: int = 5) -> str:
        """Search the user's long-term memory. Returns the best-matching episodes (id, cue,
        narrative, dates) and semantic facts (id, text), best first."""
        return _as_text(lambda: ops.search(user_id, query, top_k=top_k))

    def answer_from_memory(question: str) -> str:
        """Answer a question about the user or past conversations from long-term memory."""
        return _as_text(lambda: ops.answer(user_id, question))

    def forget(entry_id: str) -> str:
        """Delete one memory entry by its id (a fact 'sem_...', an episode 'ep_...' or a message id),
        e.g. when the user asks you to forget something. A fact is removed together with the
        conversation it came from. Get ids from search_memory."""
        return _as_text(lambda: ops.forget(user_id, entry_id))

    return [dspy.Tool(f) for f in (remember, search_memory, answer_from_memory, forget)]
