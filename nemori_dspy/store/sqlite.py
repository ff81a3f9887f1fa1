"""Embedded default store: one SQLite file (stdlib ``sqlite3``, WAL) plus exact numpy cosine top-k.

Exact numpy top-k: faster than sqlite-vec, LanceDB or Qdrant local mode at these sizes, and exact
(docs/decisions.md). Vectors are float32 BLOBs, L2-normalised on
write. The search index (``vector_index.VectorIndex``) is a per-user float32 matrix in append-only,
memory-mapped files beside the database (``<db>.index/``), updated incrementally when that user's
``generation`` counter changes (so another process's writes are seen) by reading only the rows
written since; opening a store reads no vector blob (benchmarks/store_search.py).

Lexical retrieval: episodes (cue, narrative and raw messages) and semantic entries are
also in an FTS5 table with the ``trigram`` tokenizer (works for CJK without word segmentation);
with a query text and ``lexical_weight`` > 0 its BM25 ranking is fused with the cosine ranking
(``lexical.weighted_fusion``) and the fused value is the result's score. Queries of 1–2 CJK characters, which a trigram index cannot
match, fall back to a substring match (``instr``) scored by the number of terms found.

Schema versions: 1 (first release); 2 adds ``messages.metadata`` (JSON object, ``'{}'`` for older rows);
3 adds ``semantic.event_start``/``event_end`` (NULL for older rows); 4 adds ``vseq`` (row-version number
of the search index) to episodes and semantic entries and the FTS5 table ``lexical``, built for the
existing live rows; 5 adds the semantic entries' ``origin`` (the decision that made
the version) and what retired a superseded one (``retired_at``, ``retired_by``, ``retired_decision``; NULL for
rows retired before). An older file is migrated in place when opened (in one write transaction), so old
files stay readable; a newer file is refused.

Writers across processes. Every write is one ``BEGIN IMMEDIATE`` transaction, so no write is half seen and
``add_messages`` from any number of processes loses none. Processing a user's window is longer than one
transaction (read pending messages, LLM calls, commit), so ``user_lock(user_id)`` is a per-user lock across
processes (a ``filelock`` file under ``<db>.locks/``, released by the OS if its holder dies): ``Memory`` takes
it around processing, deletions and forgetting, so two processes (two API replicas, a server and a CLI)
committing one user run one after the other; the second then sees the first's commits and finds nothing
left to redo (tests/store/test_two_writers.py). ``commit_window`` still refuses a stale window.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from filelock import FileLock, Timeout

from ..errors import EmbedderMismatchError, NotFoundError, StoreError
from ..types import (Episode, Message, ScoredEpisode, ScoredSemantic, SearchResult, SemanticEntry, SemanticVersion,
                     StoredMessage, instant, metadata_matches, utcnow)
from .base import replacements, retired_decision
from .lexical import (CANDIDATES_PER_K, DEFAULT_LEXICAL_WEIGHT, MIN_CANDIDATES, LexicalQuery, lexical_query,
                      lexical_text, weighted_fusion)
from .vector_index import IndexSnapshot, VectorIndex, cosines

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "message_key"]

log = logging.getLogger(__name__)

#: 1: first release; 2: ``messages.metadata``; 3: semantic entries carry their event span
#: (``event_start``/``event_end``, NULL for entries written before); 4: ``vseq`` row versions and the
#: FTS5 ``lexical`` table; 5: semantic ``origin``, ``retired_at``, ``retired_by``, ``retired_decision``.
#: Older files are migrated in place.
SCHEMA_VERSION = 5

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
    distilled INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 1, vseq INTEGER, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS episodes_live ON episodes (user_id, live);
CREATE TABLE IF NOT EXISTS semantic (user_id TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL,
    vector BLOB NOT NULL, sources TEXT NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL,
    live INTEGER NOT NULL DEFAULT 1, event_start TEXT, event_end TEXT, vseq INTEGER, origin TEXT, retired_at TEXT,
    retired_by TEXT, retired_decision TEXT, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS semantic_live ON semantic (user_id, live);
"""


#: columns added after version 1: (table, column, SQL type); added by ``_migrate`` when missing.
_ADDED_COLUMNS = (("messages", "metadata", "TEXT NOT NULL DEFAULT '{}'"), ("semantic", "event_start", "TEXT"),
                  ("semantic", "event_end", "TEXT"), ("episodes", "vseq", "INTEGER"), ("semantic", "vseq", "INTEGER"),
                  ("semantic", "origin", "TEXT"), ("semantic", "retired_at", "TEXT"), ("semantic", "retired_by", "TEXT"),
                  ("semantic", "retired_decision", "TEXT"))

#: made after the columns exist (so an older file can be migrated first).
_INDEXES = """
CREATE INDEX IF NOT EXISTS episodes_vseq ON episodes (user_id, live, vseq);
CREATE INDEX IF NOT EXISTS semantic_vseq ON semantic (user_id, live, vseq);
"""
_FTS = ("CREATE VIRTUAL TABLE IF NOT EXISTS lexical USING fts5(body, user_id UNINDEXED, kind UNINDEXED, "
        "tokenize='trigram')")
#: record kind → table (the FTS ``kind`` column holds the table name).
_TABLES = ("episodes", "semantic")


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


class SQLiteStore:
    """``MemoryStore`` on one SQLite file. Thread-safe: one connection per thread, WAL, busy timeout.

    Args:
        path: database file (created with parents); ``":memory:"`` is not supported (use a tmp file).
        busy_timeout_ms: how long a writer waits for a lock before ``StoreError`` (default 30 s).
        naive_timezone: zone naive timestamps are read in when episodes are ordered by time (the
            ``naive_timezone`` setting; ``open_store`` passes it).
        lexical_weight: w of the lexical/vector fusion for searches given a ``query`` text (0 = cosine
            only; the ``lexical_weight`` setting, which ``open_store`` passes).
        index_dir: folder of the memory-mapped search index files (default ``<path>.index``);
            ``False`` keeps the index in memory only.
    An existing file of an older schema version is migrated in place on opening (see ``SCHEMA_VERSION``).

    Raises:
        StoreError: the file exists with a newer schema version.
    """

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000, *, naive_timezone: str = "UTC",
                 lexical_weight: float = DEFAULT_LEXICAL_WEIGHT, index_dir: str | Path | bool | None = None) -> None:
        self.path = Path(path)
        self.naive_timezone = naive_timezone
        if not 0.0 <= float(lexical_weight) <= 1.0:
            raise StoreError(f"lexical_weight={lexical_weight!r} is outside [0, 1]. Fix: pass 0 (cosine only) to 1.")
        self.lexical_weight = float(lexical_weight)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy = busy_timeout_ms
        self._local = threading.local()
        self._indexes: dict[tuple[str, str], VectorIndex] = {}
        self._cache_lock = threading.Lock()
        self._user_locks: dict[str, FileLock] = {}
        self._conn().executescript(_SCHEMA)
        self._fts = True
        self._migrate()
        self._db_id = self._meta("db_id")
        self._index_dir = (None if index_dir is False else
                           Path(index_dir) if index_dir not in (None, True) else Path(str(self.path) + ".index"))

    def _meta(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _migrate(self) -> None:
        """Bring an older file up to ``SCHEMA_VERSION`` (in one write transaction); refuse a newer one."""
        row = self._conn().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {row[0]}, newer than this nemori-dspy "
                             f"({SCHEMA_VERSION}). Fix: upgrade nemori-dspy or use a new db_path.")
        if row is not None and int(row[0]) == SCHEMA_VERSION:
            self._fts = self._has_fts()
            return
        with self._tx() as c:  # add what is missing (another process may have migrated meanwhile)
            for table, column, kind in _ADDED_COLUMNS:
                have = {r[1] for r in c.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            for statement in filter(str.strip, _INDEXES.split(";")):
                c.execute(statement)
            c.execute("INSERT OR IGNORE INTO meta VALUES ('db_id', ?)", (uuid.uuid4().hex,))
            self._number_rows(c)
            self._build_fts(c)
            c.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _has_fts(self) -> bool:
        return self._conn().execute("SELECT 1 FROM sqlite_master WHERE name='lexical'").fetchone() is not None

    @staticmethod
    def _number_rows(c: sqlite3.Connection) -> None:
        """Give rows of an older file their ``vseq`` (in rowid order) and record the next free one."""
        top = 0
        for table in _TABLES:
            c.execute(f"UPDATE {table} SET vseq = rowid + ? WHERE vseq IS NULL", (top,))
            top = max(top, c.execute(f"SELECT COALESCE(MAX(vseq), 0) FROM {table}").fetchone()[0])
        have = c.execute("SELECT value FROM meta WHERE key='next_vseq'").fetchone()
        nxt = max(top + 1, int(have[0]) if have else 1)
        c.execute("INSERT OR REPLACE INTO meta VALUES ('next_vseq', ?)", (str(nxt),))

    def _build_fts(self, c: sqlite3.Connection) -> None:
        """Create the trigram FTS5 table and index every live row not in it yet (an older file's rows)."""
        try:
            c.execute(_FTS)
        except sqlite3.OperationalError as exc:  # SQLite < 3.34 has no trigram tokenizer
            log.warning("SQLite %s has no FTS5 trigram tokenizer (%s): search stays cosine only. Fix: use a "
                        "Python built with SQLite >= 3.34.", sqlite3.sqlite_version, exc)
            self._fts = False
            return
        self._fts = True
        for user_id, vseq, cue, nar, mids in c.execute(
                "SELECT user_id, vseq, cue, narrative, message_ids FROM episodes WHERE live=1 AND vseq NOT IN "
                "(SELECT rowid FROM lexical)").fetchall():
            self._lex_put(c, user_id, "episodes", vseq, self._episode_text(c, user_id, cue, nar, json.loads(mids)))
        c.execute("INSERT INTO lexical (rowid, body, user_id, kind) SELECT vseq, text, user_id, 'semantic' "
                  "FROM semantic WHERE live=1 AND vseq NOT IN (SELECT rowid FROM lexical)")

    # ------------------------------------------------------------------ row versions and the lexical table
    @staticmethod
    def _take_vseqs(c: sqlite3.Connection, n: int) -> int:
        """Reserve ``n`` row-version numbers (inside the write transaction); returns the first."""
        first = int(c.execute("SELECT value FROM meta WHERE key='next_vseq'").fetchone()[0])
        c.execute("UPDATE meta SET value=? WHERE key='next_vseq'", (str(first + n),))
        return first

    @staticmethod
    def _episode_text(c: sqlite3.Connection, user_id: str, cue: str, narrative: str, mids: Sequence[str]) -> str:
        contents = []
        for i in range(0, len(mids), 500):
            chunk = list(mids[i:i + 500])
            contents += [r[0] for r in c.execute(
                f"SELECT content FROM messages WHERE user_id=? AND id IN ({','.join('?' * len(chunk))}) ORDER BY seq",
                (user_id, *chunk))]
        return lexical_text(cue, narrative, *contents)

    def _lex_put(self, c: sqlite3.Connection, user_id: str, table: str, vseq: int, body: str) -> None:
        if self._fts:
            c.execute("INSERT OR REPLACE INTO lexical (rowid, body, user_id, kind) VALUES (?,?,?,?)",
                      (vseq, body, user_id, table))

    def _retire(self, c: sqlite3.Connection, table: str, user_id: str, ids: Sequence[str], delete: bool,
                by: Mapping[str, SemanticEntry] | None = None) -> int:
        """Supersede (``live=0``) or delete the user's live rows ``ids`` of ``table`` and drop them from
        the lexical table; returns how many rows changed. Superseding semantic entries records what retired
        each: ``by`` maps an id to the entry replacing it (its id and ``origin``, the decision)."""
        changed = 0
        if table == "semantic" and not delete:
            now, by = utcnow().isoformat(), by or {}
            for sid in ids:
                new = by.get(sid)
                c.execute("UPDATE semantic SET retired_at=?, retired_by=?, retired_decision=? WHERE user_id=? AND id=? "
                          "AND live=1", (now, new.id if new else None, retired_decision(new), user_id, sid))
        for i in range(0, len(ids), 500):
            chunk = list(ids[i:i + 500])
            where = f"user_id=? AND id IN ({','.join('?' * len(chunk))})"
            if self._fts:
                c.execute(f"DELETE FROM lexical WHERE rowid IN (SELECT vseq FROM {table} WHERE {where})",
                          (user_id, *chunk))
            sql = f"DELETE FROM {table} WHERE {where}" if delete else f"UPDATE {table} SET live=0 WHERE {where} AND live=1"
            changed += c.execute(sql, (user_id, *chunk)).rowcount
        return changed

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
            self._retire(c, "episodes", user_id, list(superseded), delete=False)
            self._retire(c, "episodes", user_id, [ep.id for ep in episodes], delete=True)  # replaced ids
            for ep in episodes:
                for mid in ep.message_ids:
                    c.execute("UPDATE messages SET episode_id=?, processed=1 WHERE user_id=? AND id=?",
                              (ep.id, user_id, mid))
            unique = list({ep.id: ep for ep in episodes}.values())  # a repeated id: the last one wins
            first = self._take_vseqs(c, len(unique))
            for n, ep in enumerate(unique):
                c.execute(
                    f"INSERT OR REPLACE INTO episodes ({self._EP_COLS}, user_id, live, vseq) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,1,?)",
                    (ep.id, ep.cue, ep.narrative, json.dumps(ep.message_ids), ep.start.isoformat(),
                     ep.end.isoformat(), _unit(ep.vector).tobytes(), json.dumps(ep.supersedes),
                     ep.created_at.isoformat(), ep.window, int(ep.distilled), user_id, first + n))
                self._lex_put(c, user_id, "episodes", first + n,
                              self._episode_text(c, user_id, ep.cue, ep.narrative, ep.message_ids))
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
            live = c.execute("SELECT 1 FROM episodes WHERE user_id=? AND id=? AND live=1", (user_id, episode_id))
            if live.fetchone() is None:
                raise NotFoundError(f"no live episode {episode_id!r} for user {user_id!r}.")
            self._retire(c, "episodes", user_id, [episode_id], delete=True)
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

    def _vector_index(self, user_id: str, table: str) -> VectorIndex:
        with self._cache_lock:
            idx = self._indexes.get((user_id, table))
            if idx is None:
                dim = self._dim(user_id, table)
                if not dim:  # nothing stored yet: an empty, uncached index
                    return VectorIndex(None, 0)
                stem = None
                if self._index_dir is not None and dim:
                    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
                    stem = self._index_dir / f"{self._db_id}-{digest}-{table}-{dim}"
                    try:
                        self._index_dir.mkdir(parents=True, exist_ok=True)
                    except OSError as exc:
                        log.warning("cannot create %s (%s); the search index stays in memory", self._index_dir, exc)
                        stem = None
                idx = self._indexes[(user_id, table)] = VectorIndex(stem, dim)
            return idx

    def _dim(self, user_id: str, table: str) -> int:
        """Vector size: the recorded embedder dimension, else that of a stored row (0 = none yet)."""
        known = _known_dim(self._meta("dim"))
        if known:
            return known
        row = self._conn().execute(f"SELECT length(vector) FROM {table} WHERE user_id=? AND live=1 AND "
                                   "length(vector) > 0 LIMIT 1", (user_id,)).fetchone()
        return int(row[0]) // 4 if row else 0

    def _snapshots(self, user_id: str, tables: Sequence[str]) -> dict[str, IndexSnapshot]:
        """Up-to-date index snapshots of ``tables``, read in one SQLite read transaction (one generation)."""
        c = self._conn()
        c.execute("BEGIN")
        try:
            gen = self._generation(user_id)
            return {t: self._sync(c, user_id, t, gen) for t in tables}
        finally:
            c.execute("COMMIT")

    def _sync(self, c: sqlite3.Connection, user_id: str, table: str, gen: int) -> IndexSnapshot:
        """Bring one index up to ``gen``: map its files once, append rows newer than its last vseq,
        and re-read the live vseq list only when the live count disagrees (rows were retired)."""
        idx = self._vector_index(user_id, table)
        with idx.lock:
            if idx.snapshot.generation == gen:
                return idx.snapshot
            if not idx.loaded:
                idx.load()
                self._spot_check(c, user_id, table, idx)
            rows = c.execute(f"SELECT vseq, {'window' if table == 'episodes' else '0'}, vector FROM {table} "
                             "WHERE user_id=? AND live=1 AND vseq>? ORDER BY vseq",
                             (user_id, idx.snapshot.top)).fetchall()
            if rows and idx.dim:
                idx.append([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
            live = c.execute(f"SELECT COUNT(*) FROM {table} WHERE user_id=? AND live=1", (user_id,)).fetchone()[0]
            if live != int(idx.snapshot.alive.sum()):
                vseqs = np.fromiter((r[0] for r in c.execute(
                    f"SELECT vseq FROM {table} WHERE user_id=? AND live=1", (user_id,))), dtype=np.int64)
                idx.set_alive(vseqs)
                if self._missing(c, table, user_id, np.setdiff1d(vseqs, idx.snapshot.vseqs), idx.dim):
                    # live rows the index lacks (its files were removed meanwhile): rebuild it
                    log.warning("search index %s lacks rows; rebuilding it from %s", idx.stem, self.path)
                    idx.discard()
                    rows = c.execute(f"SELECT vseq, {'window' if table == 'episodes' else '0'}, vector FROM "
                                     f"{table} WHERE user_id=? AND live=1 ORDER BY vseq", (user_id,)).fetchall()
                    idx.append([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
            idx.mark(gen)
            return idx.snapshot

    @staticmethod
    def _missing(c: sqlite3.Connection, table: str, user_id: str, vseqs: np.ndarray, dim: int) -> bool:
        """True if one of these live rows has a searchable vector (rows without one are never indexed)."""
        ids = vseqs.tolist()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            if c.execute(f"SELECT 1 FROM {table} WHERE user_id=? AND live=1 AND length(vector)=? AND vseq IN "
                         f"({','.join('?' * len(chunk))}) LIMIT 1", (user_id, 4 * dim, *chunk)).fetchone():
                return True
        return False

    def _spot_check(self, c: sqlite3.Connection, user_id: str, table: str, idx: VectorIndex) -> None:
        """A file index whose last row disagrees with the database (e.g. a restored backup) is discarded."""
        s = idx.snapshot
        if not s.n:
            return
        row = c.execute(f"SELECT vector FROM {table} WHERE user_id=? AND vseq=?", (user_id, s.top)).fetchone()
        if row is not None and not np.array_equal(np.frombuffer(row[0], dtype=np.float32), np.asarray(s.matrix[-1])):
            log.warning("search index %s does not match %s; rebuilding it", idx.stem, self.path)
            idx.discard()

    def _vseqs_of(self, table: str, user_id: str, ids: Collection[str]) -> np.ndarray:
        c, out = self._conn(), []
        ids = list(ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            out += [r[0] for r in c.execute(f"SELECT vseq FROM {table} WHERE user_id=? AND live=1 AND id IN "
                                            f"({','.join('?' * len(chunk))})", (user_id, *chunk))]
        return np.asarray(out, dtype=np.int64)

    def _lexical(self, user_id: str, table: str, q: LexicalQuery, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """(vseqs, scores) of the lexical candidates, best first: BM25 (negated, higher = better) over the
        trigram terms, else for 1–2 character CJK queries the number of terms found as substrings."""
        c = self._conn()
        match = q.fts_match()
        if match:
            rows = c.execute("SELECT rowid, -bm25(lexical) FROM lexical WHERE lexical MATCH ? AND user_id=? AND "
                             "kind=? ORDER BY bm25(lexical) LIMIT ?", (match, user_id, table, limit)).fetchall()
        else:
            # instr, not LIKE: SQLite 3.40's trigram table answers a LIKE shorter than 3 characters with no rows
            anywhere = " OR ".join("instr(body, ?) > 0" for _ in q.short)
            found = c.execute(f"SELECT rowid, body FROM lexical WHERE user_id=? AND kind=? AND ({anywhere})",
                              (user_id, table, *q.short)).fetchall()
            rows = sorted(((r, float(sum(t in body for t in q.short))) for r, body in found),
                          key=lambda t: -t[1])[:limit]
        return (np.asarray([r[0] for r in rows], dtype=np.int64), np.asarray([r[1] for r in rows], dtype=np.float64))

    def _rank(self, user_id: str, table: str, snap: IndexSnapshot, unit: np.ndarray, top_k: int,
              keep: np.ndarray, threshold: float | None, query: str | None) -> list[tuple[int, float]]:
        """(vseq, score) of the top-k kept records: by cosine, or with a query text and lexical_weight > 0
        by the fused score (``lexical.weighted_fusion``), which is then the score; ties by id."""
        if top_k <= 0 or not snap.n or snap.matrix.shape[1] != unit.size:
            return []
        cos = cosines(snap.matrix, unit)
        if threshold is not None:
            keep = keep & (cos > threshold)
        cand = np.flatnonzero(keep)
        if cand.size == 0:
            return []
        order_by = cos.astype(np.float64)
        q = lexical_query(query) if query and self.lexical_weight > 0 and self._fts else None
        if q:
            width = max(CANDIDATES_PER_K * top_k, MIN_CANDIDATES)
            vec_pos = cand if cand.size <= width else cand[np.argpartition(-cos[cand], width - 1)[:width]]
            lex_v, lex_s = self._lexical(user_id, table, q, width * (1 if keep.all() else 4))
            lex_pos = snap.positions(lex_v)
            ok = keep[lex_pos] if lex_pos.size else np.zeros(0, dtype=bool)
            lex_s = lex_s[np.isin(lex_v, snap.vseqs)][ok][:width]
            lex_pos = lex_pos[ok][:width]
            order_by = weighted_fusion(cos, (lex_pos, lex_s), self.lexical_weight)
            cand = np.union1d(vec_pos, lex_pos)
            return self._top_with_ties(table, user_id, snap, cand, order_by, order_by, top_k)
        return self._top_with_ties(table, user_id, snap, cand, order_by, cos, top_k)

    def _top_with_ties(self, table: str, user_id: str, snap: IndexSnapshot, cand: np.ndarray,
                       order_by: np.ndarray, score: np.ndarray, top_k: int) -> list[tuple[int, float]]:
        if cand.size > top_k:
            kth = np.partition(-order_by[cand], top_k - 1)[top_k - 1]
            cand = cand[-order_by[cand] <= kth]  # the k best and everything tied with the k-th
        vseqs = snap.vseqs[cand]
        names = dict(self._conn().execute(
            f"SELECT vseq, id FROM {table} WHERE user_id=? AND live=1 AND vseq IN ({','.join('?' * len(vseqs))})",
            (user_id, *vseqs.tolist())).fetchall())
        ranked = sorted((i for i in cand.tolist() if int(snap.vseqs[i]) in names),
                        key=lambda i: (-float(order_by[i]), names[int(snap.vseqs[i])]))
        return [(int(snap.vseqs[i]), float(score[i])) for i in ranked[:top_k]]

    def _episode_mask(self, user_id: str, snap: IndexSnapshot, before_window: int | None,
                      only: Collection[str] | None) -> np.ndarray:
        keep = snap.alive.copy()
        if before_window is not None:
            keep &= snap.windows < before_window
        if only is not None:
            allowed = np.zeros(snap.n, dtype=bool)
            allowed[snap.positions(self._vseqs_of("episodes", user_id, only))] = True
            keep &= allowed
        return keep

    def _semantic_mask(self, user_id: str, snap: IndexSnapshot, sources: Collection[str] | None) -> np.ndarray:
        keep = snap.alive.copy()
        if sources is not None:
            wanted = set(sources)
            rows = self._conn().execute("SELECT vseq, sources FROM semantic WHERE user_id=? AND live=1", (user_id,))
            ok = [v for v, src in rows if wanted.intersection(json.loads(src))]
            allowed = np.zeros(snap.n, dtype=bool)
            allowed[snap.positions(ok)] = True
            keep &= allowed
        return keep

    def _episodes_by_vseq(self, user_id: str, hits: list[tuple[int, float]]) -> list[ScoredEpisode]:
        if not hits:
            return []
        rows = {r[-1]: r[:-1] for r in self._conn().execute(
            f"SELECT {self._EP_COLS}, vseq FROM episodes WHERE user_id=? AND live=1 AND vseq IN ({','.join('?' * len(hits))})",
            (user_id, *[v for v, _ in hits]))}
        eps = {v: self._episode(user_id, rows[v], with_messages=False) for v, _ in hits if v in rows}
        msgs = {m.id: m for m in self.get_messages(user_id, [i for e in eps.values() for i in e.message_ids])}
        return [ScoredEpisode(episode=eps[v].model_copy(update={"messages": [msgs[i] for i in eps[v].message_ids
                                                                              if i in msgs]}), score=s)
                for v, s in hits if v in eps]

    def _entries_by_vseq(self, user_id: str, hits: list[tuple[int, float]]) -> list[ScoredSemantic]:
        if not hits:
            return []
        rows = {r[-1]: r[:-1] for r in self._conn().execute(
            f"SELECT {self._SEM_COLS}, vseq FROM semantic WHERE user_id=? AND live=1 AND vseq IN ({','.join('?' * len(hits))})",
            (user_id, *[v for v, _ in hits]))}
        return [ScoredSemantic(entry=self._entry(user_id, rows[v]), score=s) for v, s in hits if v in rows]

    def search_episodes(self, user_id: str, vector: Sequence[float], top_k: int,
                        before_window: int | None = None, only: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredEpisode]:
        """Exact cosine top-k live episodes of one user (windows < ``before_window`` only, and only
        ids in ``only``, if given); with ``query`` text and ``lexical_weight`` > 0, ranked by the fusion of
        cosine and lexical match, whose value is then the ``score``."""
        if top_k <= 0 or (only is not None and not only):
            return []
        snap = self._snapshots(user_id, ["episodes"])["episodes"]
        keep = self._episode_mask(user_id, snap, before_window, only)
        return self._episodes_by_vseq(user_id, self._rank(user_id, "episodes", snap, _unit(vector), top_k, keep,
                                                          None, query))

    def search_semantic(self, user_id: str, vector: Sequence[float], top_k: int,
                        threshold: float | None = None, sources: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredSemantic]:
        """Exact cosine top-k live semantic entries, cosine > ``threshold`` if given (τ, §3.3.1); with
        ``sources``, only entries with at least one source episode id in it; with ``query`` text and
        ``lexical_weight`` > 0, ranked by the fused score (then the ``score``; the threshold stays on cosine)."""
        if top_k <= 0:
            return []
        snap = self._snapshots(user_id, ["semantic"])["semantic"]
        keep = self._semantic_mask(user_id, snap, sources)
        return self._entries_by_vseq(user_id, self._rank(user_id, "semantic", snap, _unit(vector), top_k, keep,
                                                         threshold, query))

    def search(self, user_id: str, vector: Sequence[float], top_k: int, semantic_top_k: int,
               query: str | None = None, only: Collection[str] | None = None,
               sources: Collection[str] | None = None) -> SearchResult:
        """Both searches of the answer path (§3.4) in one pass: one read transaction brings both indexes
        up to date, the query vector is normalised once, records are fetched in one query per kind.
        Same results as ``search_episodes(..., only=only, query=query)`` and
        ``search_semantic(..., sources=sources, query=query)``."""
        tables = [t for t, k in (("episodes", top_k), ("semantic", semantic_top_k)) if k > 0]
        if not tables or (only is not None and not only and sources is not None and not sources):
            return SearchResult()
        snaps, unit = self._snapshots(user_id, tables), _unit(vector)
        episodes: list[ScoredEpisode] = []
        semantic: list[ScoredSemantic] = []
        if "episodes" in snaps and not (only is not None and not only):
            keep = self._episode_mask(user_id, snaps["episodes"], None, only)
            episodes = self._episodes_by_vseq(user_id, self._rank(user_id, "episodes", snaps["episodes"], unit, top_k,
                                                                  keep, None, query))
        if "semantic" in snaps:
            keep = self._semantic_mask(user_id, snaps["semantic"], sources)
            semantic = self._entries_by_vseq(user_id, self._rank(user_id, "semantic", snaps["semantic"], unit,
                                                                 semantic_top_k, keep, None, query))
        return SearchResult(episodes=episodes, semantic=semantic)

    # ------------------------------------------------------------------ semantic
    _SEM_COLS = "id, text, vector, sources, supersedes, created_at, event_start, event_end, origin"
    _VERSION_COLS = _SEM_COLS + ", live, retired_at, retired_by, retired_decision"

    def _entry(self, user_id: str, row: tuple) -> SemanticEntry:
        sid, text, vec, sources, sup, created, ev_start, ev_end, origin = row
        return SemanticEntry(id=sid, user_id=user_id, text=text, vector=np.frombuffer(vec, dtype=np.float32).tolist(),
                             source_episode_ids=json.loads(sources), supersedes=json.loads(sup),
                             created_at=datetime.fromisoformat(created), event_start=_from_iso(ev_start),
                             event_end=_from_iso(ev_end), origin=origin)

    def _insert_entries(self, c: sqlite3.Connection, user_id: str, entries: Sequence[SemanticEntry]) -> None:
        """Inside a write transaction: store ``entries`` live (a repeated id: the last one wins), replacing any
        row of the same id."""
        unique = list({e.id: e for e in entries}.values())
        self._retire(c, "semantic", user_id, [e.id for e in unique], delete=True)  # replaced ids
        first = self._take_vseqs(c, len(unique))
        for n, e in enumerate(unique):
            c.execute(f"INSERT OR REPLACE INTO semantic ({self._SEM_COLS}, user_id, live, vseq) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?,1,?)",
                      (e.id, e.text, _unit(e.vector).tobytes(), json.dumps(e.source_episode_ids),
                       json.dumps(e.supersedes), e.created_at.isoformat(), _iso(e.event_start),
                       _iso(e.event_end), e.origin, user_id, first + n))
            self._lex_put(c, user_id, "semantic", first + n, lexical_text(e.text))

    def commit_distillation(self, user_id: str, episode_id: str, inserts: Sequence[SemanticEntry],
                            deletes: Sequence[str]) -> None:
        """Atomically supersede ``deletes``, insert ``inserts`` and mark the episode distilled."""
        with self._tx() as c:
            self._ensure_user(c, user_id)
            self._settle_dim(c, [e.vector for e in inserts if e.vector])
            self._retire(c, "semantic", user_id, list(deletes), delete=False, by=replacements(inserts))
            self._insert_entries(c, user_id, inserts)
            c.execute("UPDATE episodes SET distilled=1 WHERE user_id=? AND id=?", (user_id, episode_id))
            self._bump(c, user_id)

    def replace_semantic(self, user_id: str, entry_id: str, replacement: SemanticEntry) -> None:
        """Atomically retire the live entry ``entry_id`` (recorded as retired by ``replacement``, with its
        ``origin`` as the decision) and store ``replacement`` live.

        Raises:
            NotFoundError: no live entry ``entry_id`` for the user.
            StoreError: ``replacement.id`` is ``entry_id`` (a new version needs its own id).
        """
        if replacement.id == entry_id:
            raise StoreError(f"replacement of {entry_id!r} has the same id. Fix: give the new version its own id.")
        with self._tx() as c:
            if c.execute("SELECT 1 FROM semantic WHERE user_id=? AND id=? AND live=1", (user_id, entry_id)).fetchone() \
                    is None:
                raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                    "Fix: list ids with Memory.list_semantic(user_id).")
            self._settle_dim(c, [replacement.vector] if replacement.vector else [])
            self._retire(c, "semantic", user_id, [entry_id], delete=False, by={entry_id: replacement})
            self._insert_entries(c, user_id, [replacement])
            self._bump(c, user_id)

    def semantic_versions(self, user_id: str, ids: Sequence[str]) -> list[SemanticVersion]:
        """Semantic entries by id, live or retired (not deleted), in the order given; unknown ids are skipped."""
        found: dict[str, SemanticVersion] = {}
        c = self._conn()
        for i in range(0, len(ids), 500):
            chunk = list(ids[i:i + 500])
            q = (f"SELECT {self._VERSION_COLS} FROM semantic WHERE user_id=? "
                 f"AND id IN ({','.join('?' * len(chunk))})")
            for row in c.execute(q, (user_id, *chunk)):
                entry = self._entry(user_id, row[:9])
                live, at, by, decision = row[9:]
                found[entry.id] = SemanticVersion(**dict(entry), live=bool(live), retired_at=_from_iso(at),
                                                  retired_by=by, retired_decision=decision)
        return [found[i] for i in dict.fromkeys(ids) if i in found]

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

    def delete_semantic(self, user_id: str, entry_id: str) -> list[str]:
        """Delete one live semantic entry; returns its source episode ids (they, and their raw
        messages, still hold what the entry said: ``forget_semantic`` removes those too).

        Raises:
            NotFoundError: no live entry ``entry_id`` for the user.
        """
        with self._tx() as c:
            row = c.execute("SELECT sources FROM semantic WHERE user_id=? AND id=? AND live=1",
                            (user_id, entry_id)).fetchone()
            if row is None:
                raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}.")
            self._retire(c, "semantic", user_id, [entry_id], delete=True)
            self._bump(c, user_id)
        return list(json.loads(row[0]))

    def forget_semantic(self, user_id: str, entry_id: str) -> dict[str, list[str]]:
        """Atomically forget a fact and where it came from: the entry; every raw message of its source
        episodes; every episode (live or superseded) holding one of those messages; the semantic
        entries sourced only from removed episodes. Other messages of a removed live episode go back
        to the buffer (as ``delete_message`` does), so nothing else is lost.

        Returns:
            ``{"semantic": [...], "episodes": [...], "messages": [...], "requeued": [...]}`` (ids removed / re-buffered).
        Raises:
            NotFoundError: no live entry ``entry_id`` for the user.
        """
        with self._tx() as c:
            row = c.execute("SELECT sources FROM semantic WHERE user_id=? AND id=? AND live=1",
                            (user_id, entry_id)).fetchone()
            if row is None:
                raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                    "Fix: list ids with Memory.list_semantic(user_id).")
            sources = set(json.loads(row[0]))
            mids = list(dict.fromkeys(m for eid, ids in c.execute(
                "SELECT id, message_ids FROM episodes WHERE user_id=? ORDER BY id", (user_id,)).fetchall()
                if eid in sources for m in json.loads(ids)))
            out = self._delete_messages(c, user_id, mids)
            if entry_id not in out["semantic"]:
                self._retire(c, "semantic", user_id, [entry_id], delete=True)
                out["semantic"] = sorted([*out["semantic"], entry_id])
            self._bump(c, user_id)
        return {"semantic": out["semantic"], "episodes": out["episodes"], "messages": mids,
                "requeued": out["requeued"]}

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
            out = self._delete_messages(c, user_id, [message_id])
            self._bump(c, user_id)
        return out

    def _delete_messages(self, c: sqlite3.Connection, user_id: str, message_ids: Sequence[str]) -> dict[str, list[str]]:
        """Inside a write transaction: delete messages, every episode holding one, the semantic entries
        sourced only from those episodes; re-buffer the removed live episodes' other messages."""
        doomed = set(message_ids)
        gone, requeue = [], []
        for eid, mids, live in c.execute("SELECT id, message_ids, live FROM episodes WHERE user_id=? "
                                         "ORDER BY id", (user_id,)).fetchall():
            ids = json.loads(mids)
            if doomed.intersection(ids):
                gone.append(eid)
                if live:
                    requeue += [m for m in ids if m not in doomed and m not in requeue]
        dead = set(gone)
        sem = [sid for sid, src in c.execute("SELECT id, sources FROM semantic WHERE user_id=? ORDER BY id",
                                             (user_id,)).fetchall()
               if (s := set(json.loads(src))) and s <= dead]
        self._retire(c, "episodes", user_id, gone, delete=True)
        self._retire(c, "semantic", user_id, sem, delete=True)
        for mid in requeue:
            c.execute("UPDATE messages SET episode_id=NULL, processed=0 WHERE user_id=? AND id=?", (user_id, mid))
        for mid in message_ids:
            c.execute("DELETE FROM messages WHERE user_id=? AND id=?", (user_id, mid))
        return {"episodes": gone, "semantic": sem, "requeued": requeue}

    # ------------------------------------------------------------------ users
    @contextmanager
    def user_lock(self, user_id: str, timeout: float | None = None) -> Iterator[None]:
        """Hold ``user_id``'s writer lock, across processes and threads, for a multi-step write.

        The lock is a file ``<db>.locks/<sha256(user_id)[:32]>.lock`` (the id never becomes a path);
        reentrant in one thread; released by the OS when the holding process dies.

        Args:
            timeout: seconds to wait for another holder; None waits until it is free.
        Raises:
            StoreError: the lock was not free within ``timeout``, or its folder cannot be written.
        """
        name = hashlib.sha256(user_id.encode()).hexdigest()[:32]
        with self._cache_lock:
            lock = self._user_locks.get(name)
            if lock is None:
                folder = Path(str(self.path) + ".locks")
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreError(f"cannot create the writer-lock folder {folder}: {exc}. Fix: make the "
                                     "database's folder writable.") from exc
                lock = self._user_locks[name] = FileLock(str(folder / f"{name}.lock"), poll_interval=0.01)
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except Timeout as exc:
            raise StoreError(f"user {user_id!r} is being written by another process (lock {lock.lock_file} held "
                             f"for more than {timeout} s). Fix: retry later.") from exc
        except OSError as exc:
            raise StoreError(f"cannot take the writer lock {lock.lock_file}: {exc}. Fix: make the database's "
                             "folder writable.") from exc
        try:
            yield
        finally:
            lock.release()

    def user_exists(self, user_id: str) -> bool:
        """True if the user was ever written."""
        return self._conn().execute("SELECT 1 FROM users WHERE user_id=?", (user_id,)).fetchone() is not None

    def list_users(self) -> list[str]:
        """All user ids, sorted."""
        return [r[0] for r in self._conn().execute("SELECT user_id FROM users ORDER BY user_id")]

    def delete_user(self, user_id: str) -> None:
        """Remove everything stored for the user (messages, episodes, semantic entries, counters)."""
        with self._tx() as c:
            for table in ("messages", "episodes", "semantic", "users") + (("lexical",) if self._fts else ()):
                c.execute(f"DELETE FROM {table} WHERE user_id=?", (user_id,))
        with self._cache_lock:
            for kind in _TABLES:
                idx = self._indexes.pop((user_id, kind), None)
                if idx is not None:
                    with idx.lock:
                        idx.discard()

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
