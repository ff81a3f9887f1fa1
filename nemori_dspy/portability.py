"""Export / import one user's memory as JSON lines (``nemori-dspy export`` / ``import``).

Records, one JSON object per line, in this order:

- ``{"type": "header", "format": 1, "user_id", "embedder", "dim", "next_window"}``
- ``{"type": "message", ...}``: every message that is buffered or held by a live episode, in arrival
  order (speaker, content, timestamp, id, metadata; ``episode_id`` for information).
- ``{"type": "episode", ...}``: every live episode with its vector, window, lineage and distilled flag.
- ``{"type": "semantic", ...}``: every live semantic entry with its vector and source episodes.

Importing replays them through the store's own atomic steps (``add_messages``, one ``commit_window``
per original window index, so association sees the same windows, then ``commit_distillation``), so
an export of the import equals the original export. Not exported: superseded episode versions
and entries (invisible to every read) and the raw messages of episodes deleted with
``delete_episode`` (kept only for idempotent re-sending; importing them would resurrect what was
deleted).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Iterator

from .errors import InvalidInputError
from .memory import Memory, validate_user_id
from .types import Episode, Message, SemanticEntry

__all__ = ["export_user", "import_user", "FORMAT"]

FORMAT = 1


def export_user(memory: Memory, user_id: str) -> Iterator[dict[str, Any]]:
    """Yield the records of one user (see the module docstring); an unknown user yields the header only."""
    store = memory.store
    validate_user_id(user_id)
    episodes = store.list_episodes(user_id)
    by_id = {m.id: m for ep in episodes for m in ep.messages}           # held by a live episode
    by_id.update({m.id: m for m in store.pending_messages(user_id)})   # buffered
    yield {"type": "header", "format": FORMAT, "user_id": user_id, "embedder": memory.embedder.name,
           "dim": memory.embedder.dim, "next_window": store.next_window(user_id)}
    for m in sorted(by_id.values(), key=lambda m: m.seq):
        yield {"type": "message", **m.model_dump(mode="json", include={"id", "speaker", "content", "timestamp",
                                                                        "metadata", "episode_id"})}
    for ep in sorted(episodes, key=lambda e: (e.window, e.start.isoformat(), e.id)):
        yield {"type": "episode", **ep.model_dump(mode="json", exclude={"messages", "user_id"})}
    for e in store.list_semantic(user_id):
        yield {"type": "semantic", **e.model_dump(mode="json", exclude={"user_id"})}


def import_user(memory: Memory, records: Iterable[dict[str, Any]], user_id: str | None = None) -> dict[str, int]:
    """Load records written by ``export_user`` under ``user_id`` (default: the exported id).

    Returns:
        counts ``{"messages", "episodes", "semantic"}``.
    Raises:
        InvalidInputError: no header / another format, a different embedder, a malformed record,
            or the target user already has memory (delete it first or import under another id).
    """
    header, messages, episodes, entries = None, [], [], []
    for i, rec in enumerate(records):
        kind = rec.get("type") if isinstance(rec, dict) else None
        body = {k: v for k, v in rec.items() if k not in ("type", "episode_id")} if kind else {}
        try:
            if kind == "header":
                header = rec
            elif kind == "message":
                messages.append(Message.model_validate(body))
            elif kind == "episode":
                episodes.append(body)
            elif kind == "semantic":
                entries.append(body)
            else:
                raise InvalidInputError(f"record {i + 1}", f"unknown type {kind!r}",
                                        "pass a file written by `nemori-dspy export`")
        except ValueError as exc:  # pydantic ValidationError is a ValueError
            if isinstance(exc, InvalidInputError):
                raise
            raise InvalidInputError(f"record {i + 1}", str(exc).splitlines()[0], "pass an unmodified export") from exc
    _check_header(header, memory)
    user = validate_user_id(user_id or header["user_id"])
    if memory.store.user_exists(user):
        raise InvalidInputError("user_id", f"{user!r} already has memory in this store",
                                "delete it first (`nemori-dspy delete --user U --all`) or import with --user NEW")
    eps = [Episode.model_validate({**e, "user_id": user}) for e in episodes]
    sems = [SemanticEntry.model_validate({**e, "user_id": user}) for e in entries]
    store = memory.store
    store.add_messages(user, messages)
    by_window: dict[int, list[Episode]] = defaultdict(list)
    for ep in eps:
        by_window[ep.window].append(ep)
    last = max([int(header.get("next_window") or 0) - 1, *by_window])
    for w in range(store.next_window(user), last + 1):
        store.commit_window(user, w, by_window.get(w, []), [])
    if sems:
        store.commit_distillation(user, "", sems, [])  # no episode is marked: their flags came with them
    return {"messages": len(messages), "episodes": len(eps), "semantic": len(sems)}


def _check_header(header: dict | None, memory: Memory) -> None:
    if header is None or header.get("format") != FORMAT:
        raise InvalidInputError("header", "missing or of another format",
                                f"pass a file written by `nemori-dspy export` (format {FORMAT})")
    if header.get("embedder") != memory.embedder.name or header.get("dim") != memory.embedder.dim:
        raise InvalidInputError("header.embedder", f"the export was built with {header.get('embedder')!r} "
                                f"({header.get('dim')}-d), this store uses {memory.embedder.name!r} "
                                f"({memory.embedder.dim}-d)", "import with the original embedder (NEMORI_EMBEDDER); "
                                "vectors of different models are not comparable")
