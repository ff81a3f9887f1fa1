"""Embedded default store: one SQLite file (stdlib ``sqlite3``, WAL) plus exact numpy cosine top-k.

Measured on this machine (issue 2): numpy exact top-10 over 50k×384 vectors ≈ 7 ms, faster than
sqlite-vec, LanceDB or Qdrant local mode, and exact. Vectors are float32 BLOBs, L2-normalised on
write, cached per user in memory and reloaded when that user's ``generation`` counter changes
(so another process's writes are seen).

Schema versions: 1 (first release); 2 adds ``messages.metadata`` (JSON object, ``'{}'`` for older rows);
3 adds ``semantic.event_start``/``event_end`` (NULL for older rows). An older file is migrated in place when
opened (``ALTER TABLE`` in one write transaction), so old files stay readable; a newer file is refused.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from ..errors import EmbedderMismatchError, NotFoundError, StoreError
from ..types import (Episode, Message, ScoredEpisode, ScoredSemantic, SemanticEntry, StoredMessage, instant,
                     metadata_matches)

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "message_key"]

#: 1: first release; 2: ``messages.metadata``; 3: semantic entries carry their event span
#: (``event_start``/``event_end``, NULL for entries written before). Older files are migrated in place.
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (user_id TEXT PRIMARY KEY, generation INTEGER NOT NULL DEFAULT 0,
    next_window INTEGER NOT NULL DEFAULT 0, next_seq INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS messages (user_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
    speaker TEXT NOT NULL, content TEXT NOT NULL, ts TEXT NOT NULL, episode_id TEXT,
    processed INTEGER NOT NULL DEFAULT 0, metadata TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS messages_pending ON messages (user_id, processed, seq);
CREATE TABLE IF NOT EXISTS episodes (user_id TEXT NOT NULL, id TEXT NOT NULL, cue TEXT NOT NULL,
    narrative TEXT NOT NULL, message_ids TEXT NOT NULL, start_ts TEXT NOT NULL, end_ts TEXT NOT NULL,
    vector BLOB NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL, window INTEGER NOT NULL,
    distilled INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS episodes_live ON episodes (user_id, live);
CREATE TABLE IF NOT EXISTS semantic (user_id TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL,
    vector BLOB NOT NULL, sources TEXT NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL,
    live INTEGER NOT NULL DEFAULT 1, event_start TEXT, event_end TEXT, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS semantic_live ON semantic (user_id, live);
"""


#: columns added after version 1: (table, column, SQL type); added by ``_migrate`` when missing.
_ADDED_COLUMNS = (("messages", "metadata", "TEXT NOT NULL DEFAULT '{}'"), ("semantic", "event_start", "TEXT"),
                  ("semantic", "event_end", "TEXT"))


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat()


def _from_iso(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text)


def message_key(m: Message) -> str:
    """Message id: the caller's id, else sha256(speaker, timestamp, content)[:16] (idempotent re-ingest)."""
    if m.id:
        return m.id
    raw = f"{m.speaker}\x1f{m.timestamp.isoformat()}\x1f{m.content}"
    return "h" + hashlib.sha256(raw.encode()).hexdigest()[:16]


def _known_dim(value: str | None) -> int | None:
    """A recorded dimension, or None when unknown (missing, empty, or the 'None' older versions wrote)."""
    return int(value) if value and value.strip().isdigit() and int(value) > 0 else None


def _unit(vector: Sequence[float]) -> np.ndarray:
    """float32 unit vector; an already-unit vector is kept bit for bit (an import re-stores exports exactly)."""
    v = np.asarray(vector, dtype=np.float32)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 and abs(n - 1.0) > 1e-6 else v


class _UserIndex:
    """Normalised vectors of one user's live records of one kind, with their ids and windows."""

    def __init__(self, generation: int, ids: list[str], matrix: np.ndarray, windows: np.ndarray) -> None:
        self.generation, self.ids, self.matrix, self.windows = generation, ids, matrix, windows


class SQLiteStore:
    """``MemoryStore`` on one SQLite file. Thread-safe: one connection per thread, WAL, busy timeout.

    Args:
        path: database file (created with parents); ``":memory:"`` is not supported (use a tmp file).
        busy_timeout_ms: how long a writer waits for a lock before ``StoreError`` (default 30 s).
        naive_timezone: zone naive timestamps are read in when episodes are ordered by time (the
            ``naive_timezone`` setting; ``open_store`` passes it).
    An existing file of an older schema version is migrated in place on opening (see ``SCHEMA_VERSION``).

    Raises:
        StoreError: the file exists with a newer schema version.
    """

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000, *, naive_timezone: str = "UTC") -> None:
        self.path = Path(path)
        self.naive_timezone = naive_timezone
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy = busy_timeout_ms
        self._local = threading.local()
        self._cache: dict[tuple[str, str], _UserIndex] = {}
        self._cache_lock = threading.Lock()
        self._conn().executescript(_SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Bring an older file up to ``SCHEMA_VERSION`` (in one write transaction); refuse a newer one."""
        row = self._conn().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {row[0]}, newer than this nemori-dspy "
                             f"({SCHEMA_VERSION}). Fix: upgrade nemori-dspy or use a new db_path.")
        if row is not None and int(row[0]) == SCHEMA_VERSION:
            return
        with self._tx() as c:  # add what is missing (another process may have migrated meanwhile)
            for table, column, kind in _ADDED_COLUMNS:
                have = {r[1] for r in c.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            c.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    # ------------------------------------------------------------------ plumbing
    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=self._busy / 1000, isolation_level=None,
                                check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            c.execute(f"PRAGMA busy_timeout={int(self._busy)}")
            self._local.conn = c
        return c

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        try:
            c.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"could not lock {self.path}: {exc}. Fix: retry, or raise busy_timeout_ms.") from exc
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    def _ensure_user(self, c: sqlite3.Connection, user_id: str) -> None:
        # A recreated user starts from a fresh, never-reused generation so no process's cache matches it.
        c.execute("INSERT OR IGNORE INTO users (user_id, generation) VALUES (?, ?)", (user_id, time.time_ns()))

    def _bump(self, c: sqlite3.Connection, user_id: str) -> None:
        c.execute("UPDATE users SET generation = generation + 1 WHERE user_id=?", (user_id,))

    def close(self) -> None:
        """Close this thread's connection."""
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    # ------------------------------------------------------------------ embedder
    def check_embedder(self, name: str, dim: int | None) -> None:
        """Record (name, dim) on first use; raise ``EmbedderMismatchError`` naming both if it differs later.

        ``dim`` may be None (a litellm embedder learns it from its first reply): the name is recorded now
        and the dimension from the first stored vector (or the first check that knows it); a later
        known dimension must then match.
        """
        with self._tx() as c:
            rows = dict(c.execute("SELECT key, value FROM meta WHERE key IN ('embedder','dim')").fetchall())
            if not rows.get("embedder"):
                c.execute("INSERT OR REPLACE INTO meta VALUES ('embedder', ?)", (name,))
                rows["embedder"] = name
            known = _known_dim(rows.get("dim"))
            if rows["embedder"] == name and known is None and dim is not None:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('dim', ?)", (str(dim),))
                return
        if rows["embedder"] != name or (dim is not None and known is not None and known != dim):
            raise EmbedderMismatchError(
                f"{self.path} was built with embedder {rows['embedder']!r} ({known or 'unknown'}-d) but is "
                f"opened with {name!r} ({dim or 'unknown'}-d). Fix: configure the original embedder, or use a "
                f"new db_path and re-ingest (vectors of different models are not comparable).")

    def _settle_dim(self, c: sqlite3.Connection, vectors: Sequence[Sequence[float]]) -> None:
        """Record the dimension of the first stored vectors if the embedder's was unknown; refuse other sizes."""
        if not vectors:
            return
        rows = dict(c.execute("SELECT key, value FROM meta WHERE key IN ('embedder','dim')").fetchall())
        known = _known_dim(rows.get("dim"))
        if known is None and rows.get("embedder"):
            known = len(vectors[0])
            c.execute("INSERT OR REPLACE INTO meta VALUES ('dim', ?)", (str(known),))
        bad = sorted({len(v) for v in vectors} - {known}) if known is not None else []
        if bad:
            raise EmbedderMismatchError(
                f"{self.path} holds {known}-d vectors of embedder {rows.get('embedder')!r}; got {bad[0]}-d ones. "
                "Fix: configure the original embedder (same model and dimensions), or use a new db_path.")

    # ------------------------------------------------------------------ messages
    def add_messages(self, user_id: str, messages: Sequence[Message]) -> list[StoredMessage]:
        """Persist messages idempotently (same id → ignored); returns the newly stored ones."""
        added: list[StoredMessage] = []
        with self._tx() as c:
            self._ensure_user(c, user_id)
            seq = c.execute("SELECT next_seq FROM users WHERE user_id=?", (user_id,)).fetchone()[0]
            for m in messages:
                key = message_key(m)
                cur = c.execute(
                    "INSERT OR IGNORE INTO messages (user_id, id, seq, speaker, content, ts, metadata) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (user_id, key, seq, m.speaker, m.content, m.timestamp.isoformat(), json.dumps(m.metadata)))
                if cur.rowcount:
                    added.append(StoredMessage(user_id=user_id, id=key, seq=seq, speaker=m.speaker,
                                               content=m.content, timestamp=m.timestamp, metadata=m.metadata))
                    seq += 1
            c.execute("UPDATE users SET next_seq=? WHERE user_id=?", (seq, user_id))
        return added

    @staticmethod
    def _msg(user_id: str, row: tuple) -> StoredMessage:
        mid, seq, speaker, content, ts, ep, meta = row
        return StoredMessage(user_id=user_id, id=mid, seq=seq, speaker=speaker, content=content,
                             timestamp=datetime.fromisoformat(ts), episode_id=ep, metadata=json.loads(meta or "{}"))

    _MSG_COLS = "id, seq, speaker, content, ts, episode_id, metadata"

    def pending_messages(self, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """Messages not yet processed into an episode, in arrival order (at most ``limit``)."""
        sql = f"SELECT {self._MSG_COLS} FROM messages WHERE user_id=? AND processed=0 ORDER BY seq"
        params: tuple = (user_id,)
        if limit is not None:
            sql += " LIMIT ?"
            params += (int(limit),)
        return [self._msg(user_id, r) for r in self._conn().execute(sql, params)]

    def get_messages(self, user_id: str, ids: Sequence[str]) -> list[StoredMessage]:
        """Messages by id in the given order; unknown ids are skipped."""
        if not ids:
            return []
        rows = {}
        c = self._conn()
        for i in range(0, len(ids), 500):
            chunk = list(ids[i:i + 500])
            q = f"SELECT {self._MSG_COLS} FROM messages WHERE user_id=? AND id IN ({','.join('?' * len(chunk))})"
            for r in c.execute(q, (user_id, *chunk)):
                rows[r[0]] = self._msg(user_id, r)
        return [rows[i] for i in ids if i in rows]

    # ------------------------------------------------------------------ episodes
    _EP_COLS = "id, cue, narrative, message_ids, start_ts, end_ts, vector, supersedes, created_at, window, distilled"

    def _episode(self, user_id: str, row: tuple, with_messages: bool = True) -> Episode:
        eid, cue, nar, mids, s, e, vec, sup, created, window, distilled = row
        ids = json.loads(mids)
        return Episode(id=eid, user_id=user_id, cue=cue, narrative=nar, message_ids=ids,
                       messages=self.get_messages(user_id, ids) if with_messages else [],
                       start=datetime.fromisoformat(s), end=datetime.fromisoformat(e),
                       vector=np.frombuffer(vec, dtype=np.float32).tolist(), supersedes=json.loads(sup),
                       created_at=datetime.fromisoformat(created), window=window, distilled=bool(distilled))

    def next_window(self, user_id: str) -> int:
        """The window index the next ``commit_window`` should use (0 for a new user)."""
        row = self._conn().execute("SELECT next_window FROM users WHERE user_id=?", (user_id,)).fetchone()
        return row[0] if row else 0

    def commit_window(self, user_id: str, window: int, episodes: Sequence[Episode],
                      superseded: Sequence[str]) -> None:
        """Atomically: supersede old episodes, insert ``episodes``, assign + mark their messages processed.

        Raises:
            StoreError: ``window`` was already committed (a replay after a crash must recompute it).
        """
        with self._tx() as c:
            self._ensure_user(c, user_id)
            expected = c.execute("SELECT next_window FROM users WHERE user_id=?", (user_id,)).fetchone()[0]
            if window != expected:
                raise StoreError(f"window {window} of user {user_id!r} is stale (next is {expected}); "
                                 "Fix: re-read pending messages and recompute the window.")
            self._settle_dim(c, [ep.vector for ep in episodes if ep.vector])
            for eid in superseded:
                c.execute("UPDATE episodes SET live=0 WHERE user_id=? AND id=?", (user_id, eid))
            for ep in episodes:
                c.execute(
                    f"INSERT OR REPLACE INTO episodes ({self._EP_COLS}, user_id, live) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,1)",
                    (ep.id, ep.cue, ep.narrative, json.dumps(ep.message_ids), ep.start.isoformat(),
                     ep.end.isoformat(), _unit(ep.vector).tobytes(), json.dumps(ep.supersedes),
                     ep.created_at.isoformat(), ep.window, int(ep.distilled), user_id))
                for mid in ep.message_ids:
                    c.execute("UPDATE messages SET episode_id=?, processed=1 WHERE user_id=? AND id=?",
                              (ep.id, user_id, mid))
            c.execute("UPDATE users SET next_window=? WHERE user_id=?", (window + 1, user_id))
            self._bump(c, user_id)

    def get_episode(self, user_id: str, episode_id: str) -> Episode:
        """One live episode with raw messages. Raises ``NotFoundError``."""
        row = self._conn().execute(f"SELECT {self._EP_COLS} FROM episodes WHERE user_id=? AND id=? AND live=1",
                                   (user_id, episode_id)).fetchone()
        if row is None:
            raise NotFoundError(f"no live episode {episode_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_episodes(user_id).")
        return self._episode(user_id, row)

    def list_episodes(self, user_id: str) -> list[Episode]:
        """All live episodes, by start time (``types.instant``) then id, with raw messages."""
        rows = self._conn().execute(f"SELECT {self._EP_COLS} FROM episodes WHERE user_id=? AND live=1",
                                    (user_id,)).fetchall()
        eps = [self._episode(user_id, r) for r in rows]
        return sorted(eps, key=lambda e: (instant(e.start, self.naive_timezone), e.id))

    def delete_episode(self, user_id: str, episode_id: str) -> None:
        """Delete one live episode (its messages stay processed). Raises ``NotFoundError``."""
        with self._tx() as c:
            cur = c.execute("DELETE FROM episodes WHERE user_id=? AND id=? AND live=1", (user_id, episode_id))
            if not cur.rowcount:
                raise NotFoundError(f"no live episode {episode_id!r} for user {user_id!r}.")
            c.execute("UPDATE messages SET episode_id=NULL WHERE user_id=? AND episode_id=?", (user_id, episode_id))
            self._bump(c, user_id)

    def episodes_to_distill(self, user_id: str) -> list[Episode]:
        """Live, not-yet-distilled episodes, in window then start order."""
        rows = self._conn().execute(f"SELECT {self._EP_COLS} FROM episodes WHERE user_id=? AND live=1 AND "
                                    "distilled=0", (user_id,)).fetchall()
        eps = [self._episode(user_id, r) for r in rows]
        return sorted(eps, key=lambda e: (e.window, instant(e.start, self.naive_timezone), e.id))

    # ------------------------------------------------------------------ search
    def _generation(self, user_id: str) -> int:
        row = self._conn().execute("SELECT generation FROM users WHERE user_id=?", (user_id,)).fetchone()
        return row[0] if row else -1

    def _index(self, user_id: str, kind: str) -> _UserIndex:
        gen = self._generation(user_id)
        with self._cache_lock:
            idx = self._cache.get((user_id, kind))
            if idx is not None and idx.generation == gen:
                return idx
        if kind == "episodes":
            rows = self._conn().execute("SELECT id, vector, window FROM episodes WHERE user_id=? AND live=1 "
                                        "ORDER BY id", (user_id,)).fetchall()
        else:
            rows = self._conn().execute("SELECT id, vector, 0 FROM semantic WHERE user_id=? AND live=1 "
                                        "ORDER BY id", (user_id,)).fetchall()
        ids = [r[0] for r in rows]
        matrix = (np.vstack([np.frombuffer(r[1], dtype=np.float32) for r in rows]) if rows
                  else np.zeros((0, 0), dtype=np.float32))
        idx = _UserIndex(gen, ids, matrix, np.asarray([r[2] for r in rows], dtype=np.int64))
        with self._cache_lock:
            self._cache[(user_id, kind)] = idx
        return idx

    @staticmethod
    def _top(idx: _UserIndex, vector: Sequence[float], top_k: int, mask: np.ndarray | None,
             threshold: float | None) -> list[tuple[str, float]]:
        if top_k <= 0 or not idx.ids:
            return []
        scores = idx.matrix @ _unit(vector)
        keep = np.ones(len(idx.ids), dtype=bool) if mask is None else mask
        if threshold is not None:
            keep &= scores > threshold
        cand = np.flatnonzero(keep)
        if cand.size == 0:
            return []
        if cand.size > top_k:
            part = np.argpartition(-scores[cand], top_k - 1)[:top_k]
            cand = cand[part]
        order = sorted(cand.tolist(), key=lambda i: (-float(scores[i]), idx.ids[i]))
        return [(idx.ids[i], float(scores[i])) for i in order]

    def search_episodes(self, user_id: str, vector: Sequence[float], top_k: int,
                        before_window: int | None = None, only: Collection[str] | None = None) -> list[ScoredEpisode]:
        """Exact cosine top-k live episodes of one user (windows < ``before_window`` only, and only
        ids in ``only``, if given)."""
        idx = self._index(user_id, "episodes")
        mask = None if before_window is None else (idx.windows < before_window)
        if only is not None:
            allowed = set(only)
            keep = np.fromiter((i in allowed for i in idx.ids), dtype=bool, count=len(idx.ids))
            mask = keep if mask is None else (mask & keep)
        hits = self._top(idx, vector, top_k, mask, None)
        return [ScoredEpisode(episode=self.get_episode(user_id, i), score=s) for i, s in hits]

    def search_semantic(self, user_id: str, vector: Sequence[float], top_k: int,
                        threshold: float | None = None, sources: Collection[str] | None = None) -> list[ScoredSemantic]:
        """Exact cosine top-k live semantic entries, score > ``threshold`` if given (τ, §3.3.1); with
        ``sources``, only entries with at least one source episode id in it."""
        idx, mask = self._index(user_id, "semantic"), None
        if sources is not None:
            wanted = set(sources)
            rows = self._conn().execute("SELECT id, sources FROM semantic WHERE user_id=? AND live=1", (user_id,))
            ok = {sid for sid, src in rows if wanted.intersection(json.loads(src))}
            mask = np.fromiter((i in ok for i in idx.ids), dtype=bool, count=len(idx.ids))
        hits = self._top(idx, vector, top_k, mask, threshold)
        return [ScoredSemantic(entry=self.get_semantic(user_id, i), score=s) for i, s in hits]

    # ------------------------------------------------------------------ semantic
    _SEM_COLS = "id, text, vector, sources, supersedes, created_at, event_start, event_end"

    def _entry(self, user_id: str, row: tuple) -> SemanticEntry:
        sid, text, vec, sources, sup, created, ev_start, ev_end = row
        return SemanticEntry(id=sid, user_id=user_id, text=text, vector=np.frombuffer(vec, dtype=np.float32).tolist(),
                             source_episode_ids=json.loads(sources), supersedes=json.loads(sup),
                             created_at=datetime.fromisoformat(created), event_start=_from_iso(ev_start),
                             event_end=_from_iso(ev_end))

    def commit_distillation(self, user_id: str, episode_id: str, inserts: Sequence[SemanticEntry],
                            deletes: Sequence[str]) -> None:
        """Atomically supersede ``deletes``, insert ``inserts`` and mark the episode distilled."""
        with self._tx() as c:
            self._ensure_user(c, user_id)
            self._settle_dim(c, [e.vector for e in inserts if e.vector])
            for sid in deletes:
                c.execute("UPDATE semantic SET live=0 WHERE user_id=? AND id=?", (user_id, sid))
            for e in inserts:
                c.execute(f"INSERT OR REPLACE INTO semantic ({self._SEM_COLS}, user_id, live) "
                          "VALUES (?,?,?,?,?,?,?,?,?,1)",
                          (e.id, e.text, _unit(e.vector).tobytes(), json.dumps(e.source_episode_ids),
                           json.dumps(e.supersedes), e.created_at.isoformat(), _iso(e.event_start),
                           _iso(e.event_end), user_id))
            c.execute("UPDATE episodes SET distilled=1 WHERE user_id=? AND id=?", (user_id, episode_id))
            self._bump(c, user_id)

    def get_semantic(self, user_id: str, entry_id: str) -> SemanticEntry:
        """One live semantic entry. Raises ``NotFoundError``."""
        row = self._conn().execute(f"SELECT {self._SEM_COLS} FROM semantic WHERE user_id=? AND id=? AND live=1",
                                   (user_id, entry_id)).fetchone()
        if row is None:
            raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_semantic(user_id).")
        return self._entry(user_id, row)

    def list_semantic(self, user_id: str) -> list[SemanticEntry]:
        """All live semantic entries, oldest first."""
        rows = self._conn().execute(f"SELECT {self._SEM_COLS} FROM semantic WHERE user_id=? AND live=1 "
                                    "ORDER BY created_at, id", (user_id,)).fetchall()
        return [self._entry(user_id, r) for r in rows]

    def delete_semantic(self, user_id: str, entry_id: str) -> None:
        """Delete one live semantic entry. Raises ``NotFoundError``."""
        with self._tx() as c:
            if not c.execute("DELETE FROM semantic WHERE user_id=? AND id=? AND live=1", (user_id, entry_id)).rowcount:
                raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}.")
            self._bump(c, user_id)

    # ------------------------------------------------------------------ metadata / delete one message
    def episodes_with_metadata(self, user_id: str, metadata: Mapping[str, Any]) -> set[str]:
        """Ids of the user's episodes (live or superseded) holding a message whose metadata has every
        key/value of ``metadata`` (JSON types kept apart: ``True`` is not ``1``)."""
        c = self._conn()
        hits = {mid for mid, meta in c.execute("SELECT id, metadata FROM messages WHERE user_id=?", (user_id,))
                if metadata_matches(json.loads(meta or "{}"), metadata)}
        if not hits:
            return set()
        return {eid for eid, mids in c.execute("SELECT id, message_ids FROM episodes WHERE user_id=?", (user_id,))
                if hits.intersection(json.loads(mids))}

    def delete_message(self, user_id: str, message_id: str) -> dict[str, list[str]]:
        """Atomically delete one message and what was derived from it only.

        Removed: the message; every episode holding it (the live one and superseded versions); the
        semantic entries whose source episodes are all among those. The live episode's other
        messages go back to the buffer (unassigned, pending, same arrival order) to be re-processed.

        Returns:
            ``{"episodes": [...], "semantic": [...], "requeued": [...]}`` (ids).
        Raises:
            NotFoundError: no such message for the user.
        """
        with self._tx() as c:
            if c.execute("SELECT 1 FROM messages WHERE user_id=? AND id=?", (user_id, message_id)).fetchone() is None:
                raise NotFoundError(f"no message {message_id!r} for user {user_id!r}. Fix: use an id returned by "
                                    "add_messages (ids) or shown in an episode's messages.")
            gone, requeue = [], []
            for eid, mids, live in c.execute("SELECT id, message_ids, live FROM episodes WHERE user_id=? "
                                             "ORDER BY id", (user_id,)).fetchall():
                ids = json.loads(mids)
                if message_id in ids:
                    gone.append(eid)
                    if live:
                        requeue += [m for m in ids if m != message_id and m not in requeue]
            dead = set(gone)
            sem = [sid for sid, src in c.execute("SELECT id, sources FROM semantic WHERE user_id=? ORDER BY id",
                                                 (user_id,)).fetchall()
                   if (s := set(json.loads(src))) and s <= dead]
            for eid in gone:
                c.execute("DELETE FROM episodes WHERE user_id=? AND id=?", (user_id, eid))
            for sid in sem:
                c.execute("DELETE FROM semantic WHERE user_id=? AND id=?", (user_id, sid))
            for mid in requeue:
                c.execute("UPDATE messages SET episode_id=NULL, processed=0 WHERE user_id=? AND id=?", (user_id, mid))
            c.execute("DELETE FROM messages WHERE user_id=? AND id=?", (user_id, message_id))
            self._bump(c, user_id)
        return {"episodes": gone, "semantic": sem, "requeued": requeue}

    # ------------------------------------------------------------------ users
    def user_exists(self, user_id: str) -> bool:
        """True if the user was ever written."""
        return self._conn().execute("SELECT 1 FROM users WHERE user_id=?", (user_id,)).fetchone() is not None

    def list_users(self) -> list[str]:
        """All user ids, sorted."""
        return [r[0] for r in self._conn().execute("SELECT user_id FROM users ORDER BY user_id")]

    def delete_user(self, user_id: str) -> None:
        """Remove everything stored for the user (messages, episodes, semantic entries, counters)."""
        with self._tx() as c:
            for table in ("messages", "episodes", "semantic", "users"):
                c.execute(f"DELETE FROM {table} WHERE user_id=?", (user_id,))
        with self._cache_lock:
            for kind in ("episodes", "semantic"):
                self._cache.pop((user_id, kind), None)

    def stats(self, user_id: str) -> dict[str, int]:
        """Counts of messages, pending messages, live/superseded episodes, semantic entries, to-distill."""
        c = self._conn()
        one = lambda q: c.execute(q, (user_id,)).fetchone()[0]  # noqa: E731
        return {
            "messages": one("SELECT COUNT(*) FROM messages WHERE user_id=?"),
            "pending": one("SELECT COUNT(*) FROM messages WHERE user_id=? AND processed=0"),
            "episodes": one("SELECT COUNT(*) FROM episodes WHERE user_id=? AND live=1"),
            "superseded_episodes": one("SELECT COUNT(*) FROM episodes WHERE user_id=? AND live=0"),
            "semantic": one("SELECT COUNT(*) FROM semantic WHERE user_id=? AND live=1"),
            "to_distill": one("SELECT COUNT(*) FROM episodes WHERE user_id=? AND live=1 AND distilled=0"),
        }
