"""Subprocess of tests/store/test_two_writers.py: one of two processes writing the same user of one SQLite file.

usage: python -m tests.store.writer_worker DB PREFIX BATCHES [--slow SECONDS] [--no-lock]
Prints "ready" once built, waits for a line on stdin (both writers start together), then adds BATCHES batches
of 3 messages (ids ``<PREFIX>-<batch>-<j>``) to user ``shared`` with processing on (window of 6, scripted LM
whose every call sleeps SECONDS), and prints one JSON line: the accepted ids and the windows it processed.
``--no-lock`` replaces the store's writer lock by a no-op (to show what the lock prevents).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import datetime, timezone

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, default_responders


def slowed(slow: float) -> dict:
    """``default_responders()``, each reply delayed by ``slow`` seconds (an LLM's latency)."""
    def delayed(fn):
        def inner(i):
            time.sleep(slow)
            return fn(i)
        return inner
    return {k: delayed(v) for k, v in default_responders().items()}


def main(db: str, prefix: str, batches: int, slow: float, no_lock: bool) -> None:
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    dspy.configure(lm=ScriptedLM(slowed(slow)), adapter=dspy.ChatAdapter())
    store = SQLiteStore(db)
    if no_lock:
        store.user_lock = lambda user_id, timeout=None: contextlib.nullcontext()  # type: ignore[method-assign]
    mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=6, cache=False))
    print("ready", flush=True)
    sys.stdin.readline()
    accepted, windows = [], 0
    for b in range(batches):
        now = datetime.now(timezone.utc)
        msgs = [{"id": f"{prefix}-{b}-{j}", "speaker": prefix, "content": f"{prefix} says thing {b}.{j}",
                 "timestamp": now.isoformat()} for j in range(3)]
        res = mem.add_messages("shared", msgs)
        accepted += res.ids
        windows += res.report.windows if res.report else 0
    print(json.dumps({"accepted": accepted, "windows": windows}), flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    slow = float(argv[argv.index("--slow") + 1]) if "--slow" in argv else 0.0
    main(argv[0], argv[1], int(argv[2]), slow, "--no-lock" in argv)
