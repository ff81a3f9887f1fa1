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
    assert int(version) == SCHEMA_VERSION == 5
    again.close()


def test_an_entry_retired_before_schema_5_reads_as_a_version_without_its_decision(tmp_path):
    path = tmp_path / "old.db"
    _v1_file(path)
    c = sqlite3.connect(path)
    c.execute("INSERT INTO semantic VALUES (?,?,?,?,?,?,?,0)",
              ("u", "s-gone", "Caroline has no pets.", np.asarray([0, 1, 0], dtype=np.float32).tobytes(),
               json.dumps(["e0"]), "[]", "2024-12-01T00:00:00+00:00"))
    c.commit()
    c.close()
    store = SQLiteStore(path)
    gone, old = store.semantic_versions("u", ["s-gone", "s-old"])
    assert not gone.live and gone.retired_decision is gone.retired_by is gone.retired_at is gone.origin is None
    assert old.live and old.origin is None
    store.close()


def test_a_newer_file_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    c = sqlite3.connect(path)
    c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    c.commit()
    c.close()
    with pytest.raises(StoreError, match="upgrade nemori-dspy"):
        SQLiteStore(path)


# --------------------------------------------------------------------------- schema 3 → 4: row versions and the lexical index
#: what a version-3 file holds (no vseq columns, no lexical table), minimal rows.
def _v3_file(path) -> None:
    c = sqlite3.connect(path)
    c.executescript(V1_SCHEMA.replace("INSERT INTO meta VALUES ('schema_version', '1');", ""))
    c.execute("ALTER TABLE messages ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'")
    c.execute("ALTER TABLE semantic ADD COLUMN event_start TEXT")
    c.execute("ALTER TABLE semantic ADD COLUMN event_end TEXT")
    c.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    c.execute("INSERT INTO users VALUES ('u', 1, 1, 3)")
    for i, text in enumerate(["卡罗琳：我去了支持小组。", "梅兰妮：我去了博物馆。"]):
        c.execute("INSERT INTO messages (user_id, id, seq, speaker, content, ts, episode_id, processed) "
                  "VALUES ('u', ?, ?, 'x', ?, '2023-05-07T13:00:00', 'e-old', 1)", (f"m{i}", i + 1, text))
    vec = lambda *v: np.asarray(v, dtype=np.float32).tobytes()  # noqa: E731
    c.execute("INSERT INTO episodes VALUES ('u','e-old','对话','两人聊天。',?, '2023-05-07T13:00:00', "
              "'2023-05-07T13:01:00', ?, '[]', '2023-05-07T13:00:00', 0, 1, 1)", (json.dumps(["m0", "m1"]), vec(0, 1, 0)))
    c.execute("INSERT INTO semantic VALUES ('u','s-near','梅兰妮去了博物馆。',?,'[\"e-old\"]','[]',"
              "'2025-01-01T00:00:00+00:00',1,NULL,NULL)", (vec(1, 0, 0),))
    c.execute("INSERT INTO semantic VALUES ('u','s-answer','卡罗琳参加了支持小组。',?,'[\"e-old\"]','[]',"
              "'2025-01-01T00:00:00+00:00',1,NULL,NULL)", (vec(0.6, 0.8, 0),))
    c.commit()
    c.close()


def test_a_version_3_file_gets_row_versions_and_a_lexical_index_for_its_rows(tmp_path):
    path = tmp_path / "v3.db"
    _v3_file(path)
    store = SQLiteStore(path)
    q = [1.0, 0.0, 0.0]
    assert [h.entry.id for h in store.search_semantic("u", q, 2)] == ["s-near", "s-answer"]
    assert [h.entry.id for h in store.search_semantic("u", q, 2, query="卡罗琳参加了什么支持小组")][0] == "s-answer"
    assert [h.episode.id for h in store.search_episodes("u", q, 1, query="支持小组")] == ["e-old"]  # raw messages
    new = SemanticEntry(id="s-new", user_id="u", text="新的事实。", vector=[0.0, 0.0, 1.0])
    store.commit_distillation("u", "e-old", [new], [])
    c = sqlite3.connect(path)
    vseqs = [r[0] for r in c.execute("SELECT vseq FROM semantic ORDER BY vseq")]
    assert len(set(vseqs)) == 3 and vseqs[-1] == c.execute("SELECT MAX(vseq) FROM semantic").fetchone()[0]
    assert c.execute("SELECT vseq FROM semantic WHERE id='s-new'").fetchone()[0] > max(vseqs[:2])
    assert c.execute("SELECT COUNT(*) FROM lexical").fetchone()[0] == 4   # 1 episode + 3 entries
    assert c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    store.close()


def test_a_query_of_two_cjk_characters_falls_back_to_substring_match(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    rows = [SemanticEntry(id=f"s{i}", user_id="u", text=t, vector=v) for i, (t, v) in
            enumerate([("梅兰妮去了博物馆。", [1.0, 0.0]), ("卡罗琳参加了小组活动。", [0.8, 0.6])])]
    store.commit_distillation("u", "e", rows, [])
    assert [h.entry.id for h in store.search_semantic("u", [1.0, 0.0], 2)] == ["s0", "s1"]
    assert [h.entry.id for h in store.search_semantic("u", [1.0, 0.0], 2, query="小组")] == ["s1", "s0"]
    assert [h.entry.id for h in store.search_semantic("u", [1.0, 0.0], 2, query="组")] == ["s1", "s0"]
    store.close()


# --------------------------------------------------------------------------- the memory-mapped search index
def _entries(ids, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    return [SemanticEntry(id=i, user_id="u", text=f"fact {i}", vector=rng.normal(size=dim).tolist()) for i in ids]


def _exact(store, q, k):
    """The reference ranking: brute force over list_semantic."""
    qv = np.asarray(q) / np.linalg.norm(q)
    scored = [(-float(np.dot(np.asarray(e.vector), qv)), e.id) for e in store.list_semantic("u")]
    return [i for _, i in sorted(scored)[:k]]


def test_the_index_lives_in_files_beside_the_database_and_a_new_store_reads_them(tmp_path):
    path = tmp_path / "m.db"
    a = SQLiteStore(path)
    a.commit_distillation("u", "e", _entries([f"s{i}" for i in range(50)]), [])
    q = np.random.default_rng(9).normal(size=8).tolist()
    first = [h.entry.id for h in a.search_semantic("u", q, 5)]
    assert first == _exact(a, q, 5)
    files = sorted(p.suffix for p in (tmp_path / "m.db.index").iterdir())
    assert ".f32" in files and ".rows" in files
    b = SQLiteStore(path)                      # another process's view: same answers from the files
    assert [h.entry.id for h in b.search_semantic("u", q, 5)] == first
    b.commit_distillation("u", "e", _entries(["late"], seed=5), [first[0]])  # b adds one, retires one
    assert [h.entry.id for h in a.search_semantic("u", q, 5)] == _exact(a, q, 5)
    assert first[0] not in [h.entry.id for h in a.search_semantic("u", q, 50)]
    assert "late" in [h.entry.id for h in a.search_semantic("u", q, 50)]
    a.close()
    b.close()


def test_a_damaged_or_foreign_index_file_is_never_trusted(tmp_path):
    path = tmp_path / "m.db"
    s = SQLiteStore(path)
    s.commit_distillation("u", "e", _entries([f"s{i}" for i in range(20)]), [])
    q = np.random.default_rng(3).normal(size=8).tolist()
    want = [h.entry.id for h in s.search_semantic("u", q, 5)]
    s.close()
    (vec,) = (tmp_path / "m.db.index").glob("*.f32")
    with open(vec, "r+b") as f:                # a torn last row
        f.truncate(vec.stat().st_size - 5)
    assert [h.entry.id for h in SQLiteStore(path).search_semantic("u", q, 5)] == want
    for p in (tmp_path / "m.db.index").iterdir():
        p.unlink()                             # files gone: rebuilt from the database
    assert [h.entry.id for h in SQLiteStore(path).search_semantic("u", q, 5)] == want
    path.unlink()
    for p in tmp_path.glob("m.db-*"):
        p.unlink()
    fresh = SQLiteStore(path)                  # a new database at the same path: the old files are not its own
    fresh.commit_distillation("u", "e", _entries(["only"], seed=7), [])
    assert [h.entry.id for h in fresh.search_semantic("u", q, 5)] == ["only"]


def test_index_files_removed_while_a_store_is_open_are_rebuilt_not_trusted(tmp_path):
    s = SQLiteStore(tmp_path / "m.db")
    s.commit_distillation("u", "e", _entries([f"s{i}" for i in range(30)]), [])
    q = [1.0] * 8
    s.search_semantic("u", q, 3)
    for p in (tmp_path / "m.db.index").iterdir():
        p.unlink()                              # e.g. a cache clean-up while the server runs
    s.commit_distillation("u", "e", _entries(["late"], seed=4), [])
    assert [h.entry.id for h in s.search_semantic("u", q, 31)] == _exact(s, q, 31)


def test_the_index_can_stay_in_memory(tmp_path):
    s = SQLiteStore(tmp_path / "m.db", index_dir=False)
    s.commit_distillation("u", "e", _entries(["a", "b", "c"]), [])
    q = [1.0] * 8
    assert [h.entry.id for h in s.search_semantic("u", q, 3)] == _exact(s, q, 3)
    s.delete_semantic("u", "a")
    assert "a" not in [h.entry.id for h in s.search_semantic("u", q, 3)]
    assert not (tmp_path / "m.db.index").exists()


def test_many_retired_rows_compact_the_files(tmp_path):
    path = tmp_path / "m.db"
    s = SQLiteStore(path)
    names = [f"s{i}" for i in range(1500)]
    s.commit_distillation("u", "e", _entries(names), [])
    q = [0.5] * 8
    s.search_semantic("u", q, 1)
    s.commit_distillation("u", "e", [], names[:1400])     # 1,400 of 1,500 retired
    assert [h.entry.id for h in s.search_semantic("u", q, 5)] == _exact(s, q, 5)
    (rows,) = (tmp_path / "m.db.index").glob("*.rows")
    assert rows.stat().st_size == 100 * 16                 # only the live rows are left on disk
    assert [h.entry.id for h in SQLiteStore(path).search_semantic("u", q, 5)] == _exact(s, q, 5)
