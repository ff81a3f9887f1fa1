"""kill -9 at random points while ingesting a LoCoMo-schema conversation (tests/data/synthetic_mini.json):
every message ends up in exactly one episode, and the store matches an uninterrupted run (scripted LM
replying by prompt hash)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import SYNTHETIC_MINI

ROOT = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("NEMORI_CRASH_KILLS", "20"))
USER = "synth-1"  # the worker ingests the first sample of SYNTHETIC_MINI (56 turns) as this user


def _spawn(db: Path, slow: float, crash_after: int = 0) -> subprocess.Popen:
    env = {**os.environ, "NEMORI_CRASH_AFTER_CALLS": str(crash_after)}
    return subprocess.Popen([sys.executable, "-m", "tests.crash_worker", str(db), str(SYNTHETIC_MINI), "--slow", str(slow)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def _run_to_end(db: Path, slow: float) -> None:
    p = _spawn(db, slow)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "done" in out


def _state(db: Path) -> tuple:
    store = SQLiteStore(db)
    eps = store.list_episodes(USER)
    ids = [m for ep in eps for m in ep.message_ids]
    sem = sorted(e.text for e in store.list_semantic(USER))
    return len(eps), sorted(ids), sem, store.stats(USER)


@pytest.mark.timeout(900)
def test_kill_9_at_random_points_loses_and_duplicates_nothing(tmp_path):
    slow = 0.01
    _run_to_end(tmp_path / "clean.db", slow)
    rng = random.Random(1234)
    clean = _state(tmp_path / "clean.db")
    kills = sequences = 0
    while kills < KILLS:  # crash sequences on fresh stores until KILLS crashes happened in all
        crashed = tmp_path / f"crashed{sequences}.db"
        for i in range(40):
            if i % 4 == 3:  # from outside, at a random wall-clock moment (may land inside a commit)
                p = _spawn(crashed, slow)
                assert p.stdout.readline().strip() == "ready"
                time.sleep(rng.uniform(0.0, 0.5))
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            else:  # the worker SIGKILLs itself when its N-th LLM call starts
                p = _spawn(crashed, slow, crash_after=rng.randint(2, 40))
            p.wait(timeout=300)
            if p.returncode == 0:
                break
            assert p.returncode == -signal.SIGKILL
            kills += 1
        _run_to_end(crashed, slow)
        n_eps, ids, sem, stats = _state(crashed)
        assert len(ids) == len(set(ids)) == 56                      # every turn exactly once
        assert (n_eps, ids, sem) == clean[:3]                        # same episodes and semantic memory
        assert stats["pending"] == 0 and stats["to_distill"] == 0 and stats["messages"] == 56
        sequences += 1
    assert kills >= KILLS
