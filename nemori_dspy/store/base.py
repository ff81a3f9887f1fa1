"""The one ``MemoryStore`` Protocol every backend implements (SQLite embedded, Weaviate).

Contract (checked by ``tests/store/test_contract.py`` against every backend):
- ``add_messages`` is idempotent on (user_id, message id) and durable when it returns.
- A message belongs to at most one live episode; ``commit_window`` assigns messages and
  supersedes merged episodes atomically.
- ``commit_distillation`` applies an episode's semantic inserts/deletes and marks it
  distilled atomically, so a crash replays the whole step or none of it.
- A deleted (superseded) semantic entry is *retired*, not removed: it is no longer searched or listed, and
  ``semantic_versions`` still reads it with what retired it (``retired_at``; ``retired_by`` = the inserted entry
  listing it in ``supersedes``, ``retired_decision`` = that entry's ``origin``: merge, conflict or user_update;
  "superseded" when no insert names it). ``replace_semantic`` retires one entry for a new version atomically.
- Searches return live (not superseded, not deleted) records of one user only, ordered by
  decreasing cosine similarity, ties broken by id. Given a ``query`` text and a lexical weight
  w > 0 (``lexical_weight`` setting), they are ordered instead by the fusion of the cosine ranking
  with a lexical (trigram BM25) ranking of the stored text (``store.lexical``), and ``score`` is that
  fused value (at most 1). ``search`` runs both searches of the answer path in one call.
- A message keeps its ``metadata`` (flat JSON object); ``episodes_with_metadata`` finds the
  episodes holding a matching message, and the ``only`` / ``sources`` search arguments restrict
  a search to them.
- ``delete_message`` removes one message and what was derived from it only, atomically, and
  puts the other messages of its live episode back in the buffer.
- ``delete_semantic`` removes the entry only and returns its source episode ids: those episodes'
  narratives and raw messages still say what it said. ``forget_semantic`` removes the entry, every
  raw message of its source episodes and, as ``delete_message`` does for each, the episodes holding
  them (live and superseded) and the entries sourced only from those.

Optional: ``user_lock(user_id)``, a context manager holding the user's writer lock across processes;
``writer_lock(store, user_id)`` takes it when the store has one (``SQLiteStore`` does; ``WeaviateStore`` does
not, so with Weaviate one process at a time may write a user: see docs/serving.md, "Scaling out").
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Collection, Mapping, Protocol, Sequence, runtime_checkable

from ..types import (RETIRE_DECISIONS, Episode, Message, ScoredEpisode, ScoredSemantic, SearchResult, SemanticEntry,
                     SemanticVersion, StoredMessage)

__all__ = ["MemoryStore", "writer_lock", "replacements", "retired_decision"]


def writer_lock(store: Any, user_id: str) -> AbstractContextManager[Any]:
    """``store.user_lock(user_id)`` (the user's writer lock across processes) when the store has one, else a
    no-op context (a store whose writes are serialised only within this process)."""
    lock = getattr(store, "user_lock", None)
    return lock(user_id) if callable(lock) else nullcontext()


def replacements(inserts: Sequence[SemanticEntry]) -> dict[str, SemanticEntry]:
    """Retired id → the inserted entry replacing it: the first of ``inserts`` listing the id in ``supersedes``."""
    out: dict[str, SemanticEntry] = {}
    for e in inserts:
        for old in e.supersedes:
            out.setdefault(old, e)
    return out


def retired_decision(replacement: SemanticEntry | None) -> str:
    """The decision a store records for an entry retired by ``replacement``: its ``origin`` when that is one of
    ``RETIRE_DECISIONS`` (merge, conflict, user_update), else ``"superseded"`` (no replacement, or one that does
    not say)."""
    origin = replacement.origin if replacement is not None else None
    return origin if origin in RETIRE_DECISIONS else "superseded"


@runtime_checkable
class MemoryStore(Protocol):
    """Persistence and exact top-k search for one memory (many users/tenants)."""

    def check_embedder(self, name: str, dim: int | None) -> None:
        """Record the embedder on first use; raise ``EmbedderMismatchError`` if it differs later.

        ``dim=None`` (not known yet): the dimension is recorded from the first stored vectors."""

    # --- message buffer
    def add_messages(self, user_id: str, messages: Sequence[Message]) -> list[StoredMessage]:
        """Persist messages (idempotent); return the newly accepted ones in arrival order."""

    def pending_messages(self, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """Buffered messages not yet in an episode, oldest first."""

    def get_messages(self, user_id: str, ids: Sequence[str]) -> list[StoredMessage]:
        """Messages by id, in the order given; unknown ids are skipped."""

    # --- episodes
    def next_window(self, user_id: str) -> int:
        """Index the next processed window gets (0, 1, ...)."""

    def commit_window(self, user_id: str, window: int, episodes: Sequence[Episode],
                      superseded: Sequence[str]) -> None:
        """Atomically store ``episodes``, assign their messages, and supersede the ``superseded`` ids."""

    def get_episode(self, user_id: str, episode_id: str) -> Episode:
        """One live episode with its raw messages; ``NotFoundError`` if absent."""

    def list_episodes(self, user_id: str) -> list[Episode]:
        """All live episodes of a user, oldest first, with raw messages."""

    def delete_episode(self, user_id: str, episode_id: str) -> None:
        """Delete a live episode; its messages are kept but unassigned-and-processed."""

    def episodes_to_distill(self, user_id: str) -> list[Episode]:
        """Live episodes whose semantic distillation has not been committed, oldest first."""

    def search_episodes(self, user_id: str, vector: Sequence[float], top_k: int,
                        before_window: int | None = None, only: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredEpisode]:
        """Exact cosine top-k over live episodes (only windows < ``before_window``, and only the
        ids in ``only``, if given); with ``query``, ranked by cosine fused with the lexical match."""

    # --- semantic memory
    def commit_distillation(self, user_id: str, episode_id: str, inserts: Sequence[SemanticEntry],
                            deletes: Sequence[str]) -> None:
        """Atomically insert entries, delete (supersede) ``deletes`` and mark the episode distilled. Each
        superseded entry is retired by the insert listing it in ``supersedes``, with that insert's ``origin`` as
        the decision (``"superseded"`` when none lists it)."""

    def replace_semantic(self, user_id: str, entry_id: str, replacement: SemanticEntry) -> None:
        """Atomically retire the live entry ``entry_id`` (retired by ``replacement``, decision
        ``replacement.origin``) and store ``replacement`` live. ``NotFoundError`` if no live ``entry_id``;
        ``StoreError`` if ``replacement.id == entry_id``."""

    def semantic_versions(self, user_id: str, ids: Sequence[str]) -> list[SemanticVersion]:
        """Semantic entries by id, live or retired (not deleted), each with what retired it, in the order given;
        unknown ids are skipped."""

    def get_semantic(self, user_id: str, entry_id: str) -> SemanticEntry:
        """One live semantic entry; ``NotFoundError`` if absent."""

    def list_semantic(self, user_id: str) -> list[SemanticEntry]:
        """All live semantic entries of a user, oldest first."""

    def delete_semantic(self, user_id: str, entry_id: str) -> list[str]:
        """Delete one live semantic entry; return its source episode ids (which still hold the fact).
        ``NotFoundError`` if absent."""

    def forget_semantic(self, user_id: str, entry_id: str) -> dict[str, list[str]]:
        """Delete the entry, the raw messages of its source episodes, every episode holding one of them
        and the entries sourced only from those; re-buffer the removed live episodes' other messages.
        Returns ``{"semantic", "episodes", "messages", "requeued"}`` id lists; ``NotFoundError`` if absent."""

    def search_semantic(self, user_id: str, vector: Sequence[float], top_k: int,
                        threshold: float | None = None, sources: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredSemantic]:
        """Exact cosine top-k over live entries, keeping only score > ``threshold`` if given, and
        only entries with a source episode id in ``sources`` if given; with ``query``, ranked by
        cosine fused with the lexical match."""

    def search(self, user_id: str, vector: Sequence[float], top_k: int, semantic_top_k: int,
               query: str | None = None, only: Collection[str] | None = None,
               sources: Collection[str] | None = None) -> SearchResult:
        """Both searches of the answer path (§3.4) in one call, sharing what they can; same results as
        ``search_episodes(..., only=only, query=query)`` and ``search_semantic(..., sources=sources, query=query)``."""

    # --- metadata and deleting one message
    def episodes_with_metadata(self, user_id: str, metadata: Mapping[str, Any]) -> set[str]:
        """Ids of episodes (live or superseded) holding a message whose metadata has every given pair."""

    def delete_message(self, user_id: str, message_id: str) -> dict[str, list[str]]:
        """Delete a message, the episodes holding it and the semantic entries sourced only from those;
        re-buffer the live episode's other messages. Returns ``{"episodes", "semantic", "requeued"}``
        id lists; ``NotFoundError`` if the message is absent."""

    # --- users
    def user_exists(self, user_id: str) -> bool:
        """True if anything was ever stored for the user."""

    def list_users(self) -> list[str]:
        """All user ids, sorted."""

    def delete_user(self, user_id: str) -> None:
        """Remove every message, episode and semantic entry of the user."""

    def stats(self, user_id: str) -> dict[str, int]:
        """Counts: messages, pending, episodes, superseded_episodes, semantic, to_distill."""

    def close(self) -> None:
        """Release connections."""
