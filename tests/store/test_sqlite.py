"""SQLiteStore specifics the shared contract cannot express: migrating a file of an older schema version."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

import numpy as np
import pytest

from nemori_dspy.errors import StoreError
from nemori_dspy.store.sqlite import SCHEMA_VERSION, SQLiteStore
from nemori_dspy.types import SemanticEntry

#: the schema of a version-1 file, as nemori-dspy with SCHEMA_VERSION = 1 created it.
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (user_id TEXT PRIMARY KEY, generation INTEGER NOT NULL DEFAULT 0,
    next_window INTEGER NOT NULL DEFAULT 0, next_seq INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS messages (user_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
    speaker TEXT NOT NULL, content TEXT NOT NULL, ts TEXT NOT NULL, episode_id TEXT,
    processed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS messages_pending ON messages (user_id, processed, seq);
CREATE TABLE IF NOT EXISTS episodes (user_id TEXT NOT NULL, id TEXT NOT NULL, cue TEXT NOT NULL,
    narrative TEXT NOT NULL, message_ids TEXT NOT NULL, start_ts TEXT NOT NULL, end_ts TEXT NOT NULL,
    vector BLOB NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL, window INTEGER NOT NULL,
    distilled INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS episodes_live ON episodes (user_id, live);
CREATE TABLE IF NOT EXISTS semantic (user_id TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL,
    vector BLOB NOT NULL, sources TEXT NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL,
    live INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user_id, id));
CREATE INDEX IF NOT EXISTS semantic_live ON semantic (user_id, live);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def _v1_file(path) -> None:
    c = sqlite3.connect(path)
    c.executescript(V1_SCHEMA)
    c.execute("INSERT INTO semantic VALUES (?,?,?,?,?,?,?,1)",
              ("u", "s-old", "Caroline likes dogs.", np.asarray([1, 0, 0], dtype=np.float32).tobytes(),
               json.dumps(["e0"]), "[]", "2025-01-01T00:00:00+00:00"))
    c.commit()
    c.close()


def test_a_version_1_file_opens_and_its_entries_have_no_event_time(tmp_path):
    path = tmp_path / "old.db"
    _v1_file(path)
    store = SQLiteStore(path)
    old = store.get_semantic("u", "s-old")
    assert old.text == "Caroline likes dogs." and old.event_start is None and old.event_end is None
    assert old.created_at == datetime.fromisoformat("2025-01-01T00:00:00+00:00")
    assert [h.entry.id for h in store.search_semantic("u", [1.0, 0.0, 0.0], 5)] == ["s-old"]
    new = SemanticEntry(id="s-new", user_id="u", text="Caroline adopted Rex.", vector=[0.0, 1.0, 0.0],
                        event_start=datetime(2023, 5, 8, 13, 0), event_end=datetime(2023, 5, 8, 14, 0))
    store.commit_distillation("u", "e1", [new], [])
    store.close()
    again = SQLiteStore(path)  # a second open of the migrated file is a no-op
    assert [e.id for e in again.list_semantic("u")][-1] == "s-new"
    assert again.get_semantic("u", "s-new").event_end == datetime(2023, 5, 8, 14, 0)
    assert again.get_semantic("u", "s-old").event_start is None
    version = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 4
    again.close()


def test_a_newer_file_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    c = sqlite3.connect(path)
    c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    c.commit()
    c.close()
    with pytest.raises(StoreError, match="upgrade nemori-dspy"):
        SQLiteStore(path)
