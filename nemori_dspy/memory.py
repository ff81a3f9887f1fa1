"""``Memory``: the public facade — add messages, flush, search, answer, inspect and delete.

Threading: calls for different users run concurrently; one user's processing is serialised by a
per-user lock, so their episodes form in message order. Across processes, the store's writer lock of the user
(``store.base.writer_lock``; a file lock with ``SQLiteStore``) is held too, so two processes over one SQLite
file never process one user at once. asyncio: every call has an ``a``-prefixed
coroutine twin (``aadd_messages``, ``aflush``, ``asearch``, ``aanswer``) that runs the blocking call
in a worker thread (``asyncio.to_thread``, context copied), so an event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import threading
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from pydantic import BaseModel, Field, ValidationError

from .config import NemoriSettings
from .embedders import Embedder
from .errors import InvalidInputError, NotFoundError, UnknownUserError
from .modules.pipeline import NemoriPipeline, ProcessReport, stage_factory
from .modules.resources import Resources
from .store.base import MemoryStore, writer_lock
from .store.sqlite import message_key
from .types import (AnswerResult, DeleteMessageResult, Episode, ForgetResult, MemoryStatus, Message, SearchResult,
                    SemanticEntry, SemanticVersion, check_metadata, instant, parse_timestamp)
from .usage import UsageLedger

__all__ = ["Memory", "AddResult", "validate_user_id"]

log = logging.getLogger(__name__)

_USER_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")

#: most versions ``Memory.semantic_history`` walks (a merge joins histories: a bound, not an expected size).
MAX_HISTORY = 500


def validate_user_id(user_id: Any) -> str:
    """Return ``user_id`` if it is a 1-256 character string without control characters, not all blanks.

    User ids are only ever bound as SQL parameters, never spliced into paths or table names,
    so ``../../etc/passwd`` or ``DROP TABLE`` are stored as inert strings.

    Raises:
        InvalidInputError: not a string, empty, longer than 256, or with control characters.
    """
    if not isinstance(user_id, str) or not _USER_ID.fullmatch(user_id) or not user_id.strip():
        shown = repr(user_id)[:60]
        raise InvalidInputError("user_id", f"{shown} is not a 1-256 character string without control "
                                "characters (and not blank)", "use a stable id such as 'alice' or a UUID")
    return user_id


_F = TypeVar("_F", bound=Callable[..., Any])


def _charged(method: _F) -> _F:
    """Run a ``Memory`` method with the memory's own ledger active: every LLM and embedding call it makes
    (in this thread, or in threads that copy its context) is charged to ``Memory.usage``."""
    @functools.wraps(method)
    def wrapper(self: "Memory", *args: Any, **kwargs: Any) -> Any:
        with self.usage.charging():
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _check_pipeline(pipeline: NemoriPipeline, store: MemoryStore, embedder: Embedder,
                    settings: NemoriSettings | None) -> None:
    """Raise ``InvalidInputError`` unless ``pipeline`` runs over this very store and embedder (and settings,
    when given): a memory has one ``Resources``, so search, listing and processing read the same store."""
    res = pipeline.res
    for name, given, its in (("store", store, res.store), ("embedder", embedder, res.embedder)):
        if given is not its:
            raise InvalidInputError("pipeline", f"was built over another {name} than the one passed",
                                    f"build it as NemoriPipeline(Resources(store, embedder, settings), ...) with the "
                                    f"same {name} object you pass to Memory")
    if settings is not None and settings != res.settings:
        raise InvalidInputError("pipeline", "was built with other settings than the ones passed",
                                "pass the pipeline's own settings (pipeline.res.settings), or leave settings unset")


def _parse_messages(messages: Iterable[Message | dict]) -> list[Message]:
    out: list[Message] = []
    for i, m in enumerate(messages):
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, dict):
            raise InvalidInputError(f"messages[{i}]", f"expected a Message or dict, got {type(m).__name__}",
                                    "pass {'speaker': ..., 'content': ..., 'timestamp': ...}")
        data = dict(m)
        if "role" in data and "speaker" not in data:
            data["speaker"] = data.pop("role")
        try:
            out.append(Message.model_validate(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "?"
            inner = (err.get("ctx") or {}).get("error")
            if isinstance(inner, InvalidInputError):  # already says what is wrong and how to fix it
                named = inner.field if inner.field.startswith(field) else field  # e.g. metadata.key
                raise InvalidInputError(f"messages[{i}].{named}", inner.problem, inner.fix) from exc
            raise InvalidInputError(f"messages[{i}].{field}", err["msg"],
                                    "give speaker (str), non-blank content (str), timestamp "
                                    "(ISO 8601 or datetime), optional id (str) and metadata (object)") from exc
        except InvalidInputError as exc:
            raise InvalidInputError(f"messages[{i}].{exc.field}", exc.problem, exc.fix) from exc
    return out


class AddResult(BaseModel):
    """What ``Memory.add_messages`` returns: what was stored, what was skipped, what still waits.

    A message without an id is stored under ``h`` + a content hash (``store.sqlite.message_key``), and
    that is the id listed here.
    """

    accepted: int = Field(ge=0, description="new messages stored by this call")
    duplicates: int = Field(ge=0, description="messages already stored, or repeated within the batch")
    ids: list[str] = Field(default_factory=list,
                           description="ids of the messages stored by this call, in arrival order")
    duplicate_ids: list[str] = Field(default_factory=list,
                                     description="ids of the messages skipped as duplicates, in batch order")
    pending: int = Field(ge=0, description="messages of the user still buffered (not in an episode) after the call")
    report: ProcessReport | None = Field(default=None, description="what processing did; None with process=False")


class Memory:
    """Long-term memory for one store, many users.

    Args:
        store: a ``MemoryStore`` (e.g. ``SQLiteStore(path)``).
        embedder: an ``Embedder``; its name and dimension are checked against the store.
        settings: knobs (window size, top-k, τ...); default ``NemoriSettings()``.
        pipeline: a prebuilt ``NemoriPipeline`` (e.g. loaded optimized state) over this ``store`` and
            ``embedder``; its ``Resources`` become the memory's (one per memory). Default built from settings.
        stage_lms: per-stage LMs (see ``Runtime.stage_lms``). LM calls use ``dspy.settings.lm``.

    ``usage`` is this memory's own ``UsageLedger``: every LLM and embedding call made by its methods is
    charged to it (and to any ledger active around the call, e.g. an eval run's), never to another
    ``Memory`` in the same process. Code that drives ``pipeline`` directly charges it with
    ``with memory.usage.charging(): ...``.
    Raises:
        EmbedderMismatchError: the store was built with another embedder.
        InvalidInputError: ``pipeline`` was built over another store, embedder or settings.
    """

    def __init__(self, store: MemoryStore, embedder: Embedder, settings: NemoriSettings | None = None,
                 pipeline: NemoriPipeline | None = None, stage_lms: dict | None = None) -> None:
        if pipeline is not None:
            _check_pipeline(pipeline, store, embedder, settings)
        self.settings = pipeline.res.settings if pipeline is not None else (settings or NemoriSettings())
        self.store = store
        self.embedder = embedder
        store.check_embedder(embedder.name, embedder.dim)
        #: the one ``Resources`` of this memory: the pipeline's, so every path reads the same store handle.
        self.resources = pipeline.res if pipeline is not None else Resources(store, embedder, self.settings)
        self.pipeline = pipeline or NemoriPipeline(self.resources, stage_factory(self.settings, stage_lms))
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self._parked: dict[str, list[str]] = {}
        self.usage = UsageLedger()

    @contextmanager
    def _lock(self, user_id: str) -> Iterator[None]:
        """Hold the user's lock in this process, then the store's writer lock of the user across processes."""
        with self._locks_guard:
            lock = self._locks[user_id]
        with lock, writer_lock(self.store, user_id):
            yield

    def _known(self, user_id: str) -> str:
        validate_user_id(user_id)
        if not self.store.user_exists(user_id):
            raise UnknownUserError(user_id)
        return user_id

    # ------------------------------------------------------------------ ingest
    @_charged
    def add_messages(self, user_id: str, messages: Sequence[Message | dict], process: bool = True) -> AddResult:
        """Persist messages, then (if ``process``) build episodes from every full window of ``window_size``
        messages (w; 40 by default, the paper's 20 in ``PAPER_FAITHFUL``).

        Blocks: the messages are durably stored before any LLM call, and when the call returns every
        full window has been processed (LLM calls happen in the calling thread). Messages of a partial
        window, and with ``hold_open_segment`` those after a full window's last time gap, stay buffered
        until more arrive or ``flush``. Re-sending a message (same id, or same
        speaker + timestamp + content when no id) is a no-op.

        Returns:
            ``AddResult`` with ``accepted``, ``duplicates``, ``ids``, ``duplicate_ids``, ``pending``
            and ``report``.
        Raises:
            InvalidInputError: a bad user id or message field (nothing is stored then).
        """
        validate_user_id(user_id)
        if isinstance(messages, (str, bytes, dict, Message)) or not isinstance(messages, (list, tuple)):
            raise InvalidInputError("messages", "expected a list of messages", "wrap a single message in a list")
        parsed = _parse_messages(messages)
        accepted = self.store.add_messages(user_id, parsed)
        fresh = {m.id for m in accepted}
        duplicate_ids = []
        for m in parsed:
            key = message_key(m)
            if key in fresh:
                fresh.discard(key)  # its first occurrence was stored; a repeat in the batch is a duplicate
            else:
                duplicate_ids.append(key)
        report = self.process(user_id) if process else None
        return AddResult(accepted=len(accepted), duplicates=len(duplicate_ids), ids=[m.id for m in accepted],
                         duplicate_ids=duplicate_ids, pending=self.store.stats(user_id)["pending"], report=report)

    @_charged
    def process(self, user_id: str, force: bool = False, max_windows: int | None = None) -> ProcessReport:
        """Process full windows (every pending message if ``force``); one user at a time.

        ``max_windows`` stops after that many windows (a background worker processes one window at
        a time so it can stop between windows); None = until the buffer holds less than a window.
        """
        with self._lock(user_id):
            report = self.pipeline.process(user_id, force=force, max_windows=max_windows)
            self._parked[user_id] = list(report.parked)  # the latest pass: cleared once work succeeds
        for p in report.parked:
            log.warning("parked for %s: %s", user_id, p)
        return report

    def flush(self, user_id: str) -> ProcessReport:
        """Process every buffered message of the user now, even a partial window (end of conversation).

        Raises:
            UnknownUserError: nothing was ever added for ``user_id``.
        """
        return self.process(self._known(user_id), force=True)

    def status(self, user_id: str) -> MemoryStatus:
        """Health of one user's memory: what is stored, what waits, and why.

        Returns:
            ``MemoryStatus``: the store's counts (``messages``, ``pending``, ``episodes``,
            ``superseded_episodes``, ``semantic``, ``to_distill``; read from the store, so they survive a
            restart), ``known``, ``parked`` (this process's latest pass), ``healthy`` and ``counters`` of this
            ``Memory`` since it was made (``Memory.usage``; another memory in the process has its own).
        Raises:
            InvalidInputError: a malformed user id.
        """
        stats = self.store.stats(validate_user_id(user_id))
        parked = list(self._parked.get(user_id, []))
        return MemoryStatus(**stats, known=self.store.user_exists(user_id), parked=parked,
                            healthy=not parked and stats.get("to_distill", 0) == 0, counters=dict(self.usage.counters))

    # ------------------------------------------------------------------ query
    @_charged
    def search(self, user_id: str, query: str, top_k: int | None = None,
               semantic_top_k: int | None = None, metadata: dict | None = None) -> SearchResult:
        """Top-k episodes and top-m semantic entries by cosine to ``query`` (k = 10, m = 20 by default, §4.1).

        ``metadata`` (e.g. ``{"session": "s1"}``) keeps only episodes holding a message whose
        metadata has every given key/value (superseded versions count: a merged episode inherits its
        messages), and only semantic entries distilled from such an episode. A user with no memory
        (never added, or deleted) gets an empty result, not an error.

        Raises:
            InvalidInputError: empty query, malformed user id or metadata, negative top-k.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query", "is empty", "pass a non-empty question or phrase")
        for name, k in (("top_k", top_k), ("semantic_top_k", semantic_top_k)):
            if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
                raise InvalidInputError(name, f"{k!r} is not a whole number >= 0", "pass e.g. 5, or leave it unset")
        validate_user_id(user_id)
        wanted = check_metadata(metadata) if metadata is not None else None
        if not self.store.user_exists(user_id):
            return SearchResult()
        if not wanted:
            return self.pipeline.response.retrieve(user_id, query, top_k, semantic_top_k)
        eids = self.store.episodes_with_metadata(user_id, wanted)
        if not eids:
            return SearchResult()
        return self.pipeline.response.retrieve(user_id, query, top_k, semantic_top_k, only=eids, sources=eids)

    @_charged
    def answer(self, user_id: str, question: str, use_memory: bool = True) -> AnswerResult:
        """Answer from memory with P_ans (§3.4); ``use_memory=False`` answers with an empty context.

        A user with no memory is answered like one whose memory holds nothing relevant (P_ans with
        an empty context), not with an error; nothing is written.

        Returns:
            ``AnswerResult`` with the answer, the context string used, what was retrieved, and the
            usage of this call's answer stage.
        Raises:
            InvalidInputError: empty question or malformed user id.
        """
        if not isinstance(question, str) or not question.strip():
            raise InvalidInputError("question", "is empty", "pass a non-empty question")
        validate_user_id(user_id)  # an unknown user's searches come back empty: same path, no write
        with self.usage.scope() as mine:
            pred = self.pipeline(user_id=user_id, question=question, use_memory=use_memory)
        return AnswerResult(question=question, answer=pred.answer, context=pred.context, retrieved=pred.retrieved,
                            usage=mine.total(), mode="memory" if use_memory else "no-memory")

    # ------------------------------------------------------------------ inspect / delete
    def get_episode(self, user_id: str, episode_id: str) -> Episode:
        """One live episode with raw messages. Raises ``NotFoundError`` (also for an unknown user)."""
        return self.store.get_episode(validate_user_id(user_id), episode_id)

    def list_episodes(self, user_id: str) -> list[Episode]:
        """All live episodes of the user, oldest first ([] for an unknown user)."""
        return self.store.list_episodes(validate_user_id(user_id))

    def delete_episode(self, user_id: str, episode_id: str) -> None:
        """Delete one episode (its messages are not re-buffered)."""
        self.store.delete_episode(self._known(user_id), episode_id)

    def get_semantic(self, user_id: str, entry_id: str) -> SemanticEntry:
        """One live semantic entry. Raises ``NotFoundError`` (also for an unknown user)."""
        return self.store.get_semantic(validate_user_id(user_id), entry_id)

    def list_semantic(self, user_id: str) -> list[SemanticEntry]:
        """All live semantic entries of the user, oldest first ([] for an unknown user)."""
        return self.store.list_semantic(validate_user_id(user_id))

    @_charged
    def update_semantic(self, user_id: str, entry_id: str, text: str, event_start: Any = None,
                        event_end: Any = None) -> SemanticEntry:
        """Correct a fact: store ``text`` as the entry's new version and retire the old one with the decision
        ``"user_update"``.

        The new version has its own id (``sem_`` + a hash of the old id and the text), ``supersedes`` the old
        one, keeps its source episodes and, unless ``event_start``/``event_end`` are given (datetime or ISO
        8601; one alone sets both), its event span; ``created_at`` is now. The old version is kept, never
        searched or listed, and readable with ``semantic_history``. The episodes the fact came from are not
        changed (their narratives and raw messages still say what they said). Runs under the user's lock.

        Returns:
            the new version (``origin == "user_update"``).
        Raises:
            UnknownUserError: nothing was ever added for ``user_id``.
            NotFoundError: no live semantic entry ``entry_id`` (a retired version cannot be corrected: correct
                the live one ``semantic_history`` names).
            InvalidInputError: blank ``text`` or an unparseable event time.
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("text", "is empty", "pass the corrected statement, e.g. 'Alice lives in Berlin.'")
        start = parse_timestamp(event_start, "event_start") if event_start is not None else None
        end = parse_timestamp(event_end, "event_end") if event_end is not None else None
        with self._lock(self._known(user_id)):
            old = self.store.get_semantic(user_id, entry_id)
            if start is None and end is None:
                start, end = old.event_start, old.event_end
            digest = hashlib.sha256(f"{user_id}\x1f{entry_id}\x1fuser_update\x1f{text}".encode()).hexdigest()[:16]
            new = SemanticEntry(id=f"sem_{digest}", user_id=user_id, text=text.strip(),
                                vector=self.resources.embed(text.strip()), source_episode_ids=old.source_episode_ids,
                                supersedes=[old.id], event_start=start, event_end=end, origin="user_update")
            self.store.replace_semantic(user_id, entry_id, new)
        return new

    def semantic_history(self, user_id: str, entry_id: str) -> list[SemanticVersion]:
        """Every version of a fact, oldest first: the versions ``entry_id`` replaced (``supersedes``, back to the
        first) and those that replaced it (``retired_by``, up to the live one), each with its text, event span,
        ``created_at``, ``origin`` and, once retired, ``retired_at``, ``retired_by`` and ``retired_decision``
        (``merge`` or ``conflict`` by consolidation, ``user_update`` by ``update_semantic``). A merge joins
        histories, so the entries merged with it are listed too. ``entry_id`` may be live or retired.

        Raises:
            NotFoundError: no version ``entry_id`` for the user (never stored, deleted or forgotten).
        """
        validate_user_id(user_id)
        seen: dict[str, SemanticVersion] = {}
        asked: set[str] = set()
        frontier = [entry_id]
        while frontier and len(seen) < MAX_HISTORY:
            frontier = frontier[:MAX_HISTORY - len(seen)]
            asked.update(frontier)
            for v in self.store.semantic_versions(user_id, frontier):
                seen[v.id] = v
            linked = [i for v in seen.values() for i in (*v.supersedes, v.retired_by) if i]
            frontier = [i for i in dict.fromkeys(linked) if i not in asked]
        if entry_id not in seen:
            raise NotFoundError(f"no semantic entry {entry_id!r} (live or retired) for user {user_id!r}. "
                                "Fix: list ids with Memory.list_semantic(user_id).")
        tz = self.settings.naive_timezone
        return sorted(seen.values(), key=lambda v: (instant(v.created_at, tz), v.id))

    def delete_semantic(self, user_id: str, entry_id: str) -> list[str]:
        """Delete one semantic entry and return its source episode ids.

        Only the entry goes: those episodes' narratives and raw messages still hold what it said, and
        an answer context can still show it. To remove that too, use ``forget``.

        Raises:
            UnknownUserError: nothing was ever added for ``user_id``. NotFoundError: no such entry.
        """
        return self.store.delete_semantic(self._known(user_id), entry_id)

    def forget(self, user_id: str, entry_id: str) -> ForgetResult:
        """Forget a fact everywhere it is held: the semantic entry, the raw messages of its source
        episodes, every episode holding one of those messages (live and superseded versions) and the
        entries distilled only from those episodes (``delete_message`` for each message). Other
        messages of a removed episode go back to the buffer and are re-formed into episodes by the
        next processing pass, so nothing the user did not ask to forget is lost. Runs under the
        user's lock.

        Returns:
            ``ForgetResult``: the ``semantic``, ``episodes`` and ``messages`` ids removed, the ``requeued`` ids.
        Raises:
            UnknownUserError: nothing was ever added for ``user_id``.
            NotFoundError: no live semantic entry ``entry_id`` for the user.
        """
        if not isinstance(entry_id, str) or not entry_id:
            raise InvalidInputError("entry_id", f"{entry_id!r} is not a semantic entry id",
                                    "pass an id from search results or list_semantic")
        with self._lock(self._known(user_id)):
            return ForgetResult(**self.store.forget_semantic(user_id, entry_id))

    def delete_message(self, user_id: str, message_id: str) -> DeleteMessageResult:
        """Forget one message and what was derived from it only.

        Deleted: the message; the episode holding it (and superseded versions of that episode that
        held it); the semantic entries whose source episodes are all among those (an entry also
        backed by another episode is kept). The episode's *other* messages are not lost: they go back
        to the buffer in their arrival order and are re-formed into episodes by the next processing
        pass (the next ``add_messages`` with a full window, or ``flush``), exactly as if they had just
        arrived. Until then they are stored but not searchable. Runs under the user's lock, so it never
        interleaves with that user's processing.

        Returns:
            ``DeleteMessageResult``: the ``episodes`` and ``semantic`` ids deleted, the ``requeued`` ids.
        Raises:
            UnknownUserError: nothing was ever added for ``user_id``.
            NotFoundError: no message ``message_id`` for the user.
        """
        if not isinstance(message_id, str) or not message_id:
            raise InvalidInputError("message_id", f"{message_id!r} is not a message id",
                                    "pass an id from AddResult.ids or an episode's messages")
        with self._lock(self._known(user_id)):
            return DeleteMessageResult(**self.store.delete_message(user_id, message_id))

    def delete_user(self, user_id: str) -> None:
        """Remove everything derived from the user: messages, episodes, semantic entries."""
        with self._lock(self._known(user_id)):
            self.store.delete_user(user_id)

    # ------------------------------------------------------------------ asyncio
    async def aadd_messages(self, user_id: str, messages: Sequence[Message | dict],
                            process: bool = True) -> AddResult:
        """``add_messages`` for asyncio: same contract, run in a worker thread."""
        return await asyncio.to_thread(self.add_messages, user_id, messages, process)

    async def aflush(self, user_id: str) -> ProcessReport:
        """``flush`` for asyncio: same contract, run in a worker thread."""
        return await asyncio.to_thread(self.flush, user_id)

    async def asearch(self, user_id: str, query: str, top_k: int | None = None,
                      semantic_top_k: int | None = None) -> SearchResult:
        """``search`` for asyncio: same contract, run in a worker thread."""
        return await asyncio.to_thread(self.search, user_id, query, top_k, semantic_top_k)

    async def aanswer(self, user_id: str, question: str, use_memory: bool = True) -> AnswerResult:
        """``answer`` for asyncio: same contract, run in a worker thread."""
        return await asyncio.to_thread(self.answer, user_id, question, use_memory)
