"""Parallel construction: 10 conversations built one after another vs in threads, scripted LM sleeping per call.

The LM (``nemori_dspy.testing.ScriptedLM``) sleeps ``--delay`` seconds per call, standing in for a model
server's latency; everything else runs for real (pipeline, adapter, hashing embedder, one SQLite store shared
by all users, per-user locks). With threads the sleeps overlap, so the speed-up says how little of the
framework is serialised. Target: threads >= 8x faster than sequential at 10 conversations.

usage: python -m benchmarks.parallel_construction [--conversations 10] [--messages 20] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dspy

from benchmarks.framework_overhead import synthetic_messages
from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.adapters import make_adapter
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.testing import ScriptedLM, default_responders

__all__ = ["TARGET_SPEEDUP", "sleeping_lm", "build_all", "run", "main"]

TARGET_SPEEDUP = 8.0


def sleeping_lm(delay: float) -> ScriptedLM:
    """The default scripted replies, each after ``delay`` seconds."""
    def slow(fn: Any) -> Any:
        def inner(inputs: dict[str, str]) -> str:
            time.sleep(delay)
            return fn(inputs)
        return inner

    return ScriptedLM({name: slow(fn) for name, fn in default_responders().items()})


def build_all(conversations: int, messages: int, delay: float, threads: int) -> tuple[float, int]:
    """Build ``conversations`` memories of ``messages`` turns with ``threads`` workers (1 = sequential);
    returns (wall seconds, LLM calls)."""
    lm = sleeping_lm(delay)
    settings = NemoriSettings(cache=False, _env_file=None)
    turns = [synthetic_messages(messages, seed=c) for c in range(conversations)]
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm, adapter=make_adapter(settings.adapter)):
        mem = Memory(SQLiteStore(Path(tmp) / "m.db"), HashingEmbedder(64), settings)

        def one(c: int) -> None:
            with dspy.context(lm=lm, adapter=make_adapter(settings.adapter)):  # contexts are per thread
                mem.add_messages(f"user{c}", turns[c])
                mem.flush(f"user{c}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(conversations)))
        return time.perf_counter() - t0, sum(lm.calls.values())


def run(conversations: int, messages: int, delay: float) -> dict[str, Any]:
    """Sequential, then one thread per conversation (after a small warm-up); returns seconds, calls, speed-up."""
    build_all(1, 4, 0.0, threads=1)  # imports and DSPy's first-call set-up, not counted
    seq_s, seq_calls = build_all(conversations, messages, delay, threads=1)
    par_s, par_calls = build_all(conversations, messages, delay, threads=conversations)
    return {"sequential_s": seq_s, "threads_s": par_s, "speedup": seq_s / par_s, "lm_calls": seq_calls,
            "lm_calls_threads": par_calls, "ideal_speedup": float(conversations)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table, write ``results/parallel_construction.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--messages", type=int, default=20, help="turns per conversation")
    ap.add_argument("--delay", type=float, default=0.2, help="seconds the scripted LM sleeps per call")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    f = run(a.conversations, a.messages, a.delay)
    print(table(["measure", "figure", "target"], [
        ["conversations x turns", f"{a.conversations} x {a.messages}", ""],
        ["LLM calls (each sleeps %.0f ms)" % (1000 * a.delay), f"{f['lm_calls']:,}", ""],
        ["sequential (s)", f"{f['sequential_s']:.1f}", ""],
        [f"{a.conversations} threads (s)", f"{f['threads_s']:.1f}", ""],
        ["speed-up", f"{f['speedup']:.1f}x", f">= {TARGET_SPEEDUP:.0f}x (ideal {a.conversations}x)"]]))
    print(f"written {write_result('parallel_construction', vars(a), f, a.out_dir)}")
    return f


if __name__ == "__main__":
    main()
