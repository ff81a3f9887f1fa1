"""Two processes writing one user of one SQLite file: the per-user writer lock (``SQLiteStore.user_lock``, taken
by ``Memory`` around processing) makes them commit one after the other, so no accepted message is lost and the
user's episodes and semantic entries are consistent (each message in exactly one live episode, each episode
distilled once)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.errors import StoreError
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 6


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", line + proc.stderr.read()


@pytest.mark.timeout(600)
def test_two_processes_committing_one_user_lose_no_message_and_stay_consistent(tmp_path, scripted):
    db = tmp_path / "m.sqlite3"
    SQLiteStore(db).close()  # schema made once, before the race
    procs = [_spawn("-m", "tests.store.writer_worker", str(db), p, str(BATCHES), "--slow", "0.02")
             for p in ("a", "b")]
    for p in procs:
        _ready(p)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=540)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    accepted = [i for o in outs for i in o["accepted"]]
    assert len(accepted) == len(set(accepted)) == 2 * BATCHES * 3

    store = SQLiteStore(db)
    mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=6, cache=False))
    mem.flush("shared")
    stats = store.stats("shared")
    assert stats["messages"] == len(accepted) and stats["pending"] == 0 and stats["to_distill"] == 0
    assert {m.id for m in store.get_messages("shared", accepted)} == set(accepted)
    episodes = store.list_episodes("shared")
    held = [mid for ep in episodes for mid in ep.message_ids]
    assert sorted(held) == sorted(accepted)  # every message in exactly one live episode
    assert all(m.episode_id is not None for m in store.get_messages("shared", accepted))
    windows = sorted({ep.window for ep in episodes})
    assert windows == list(range(store.next_window("shared")))  # no window committed twice or skipped
    entries = store.list_semantic("shared")
    assert not [k for k, n in Counter((e.text, tuple(e.source_episode_ids)) for e in entries).items() if n > 1]
    sourced = {s for e in entries for s in e.source_episode_ids}
    assert sourced == {ep.id for ep in episodes}  # each episode distilled (once: no duplicate entry above)


_HOLDER = ("import sys; from nemori_dspy.store.sqlite import SQLiteStore; s = SQLiteStore(sys.argv[1]); "
           "lock = s.user_lock('alice'); lock.__enter__(); print('held', flush=True); sys.stdin.readline()")


def test_the_writer_lock_excludes_another_process_per_user_and_frees_when_its_holder_dies(tmp_path):
    db = tmp_path / "m.sqlite3"
    SQLiteStore(db).close()
    holder = _spawn("-c", _HOLDER, str(db))
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        store = SQLiteStore(db)
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="being written by another process"):
            with store.user_lock("alice", timeout=0.3):
                pass
        assert time.monotonic() - t0 >= 0.25
        with store.user_lock("bob", timeout=0.3):  # another user is not held
            pass
    finally:
        holder.kill()
        holder.wait()
    with store.user_lock("alice", timeout=5):  # the OS released the dead holder's lock
        with store.user_lock("alice", timeout=0):  # reentrant in one thread
            pass
    assert list(Path(str(db) + ".locks").iterdir())  # the lock files sit beside the database
