"""Framework overhead: messages per second through the whole construction pipeline with an instant scripted LM.

Everything but the model runs for real, with the adapter the ``adapter`` setting picks: message validation and storage, windowing, partition, narrate,
anticipate, distill, consolidate (DSPy adapters formatting and parsing every prompt, usage accounting,
stage records), the hashing embedder and the SQLite store. The LM answers at once
(``nemori_dspy.testing.ScriptedLM``), so the rate is what the framework itself costs per message.

usage: python -m benchmarks.framework_overhead [--conversations 4] [--messages 200] [--profile]
(``--profile`` prints cProfile's top functions by cumulative time). Target: >= 1,000 msgs/s.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dspy

from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.adapters import make_adapter
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.testing import ScriptedLM, default_responders

__all__ = ["TARGET_MSGS_PER_S", "synthetic_messages", "run", "main"]

TARGET_MSGS_PER_S = 1000.0
_TOPICS = ("hiking in the Alps", "a new jazz record", "the pottery class", "moving to Lisbon", "her adoption plans",
           "a marathon in May", "the book club", "a painting of a sunrise")


def synthetic_messages(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` turns of a two-speaker chat, one minute apart, sessions of 40 turns a day apart (deterministic)."""
    start = datetime(2023, 5, 1, 9, 0)
    out = []
    for i in range(n):
        when = start + timedelta(days=i // 40, minutes=i % 40)
        topic = _TOPICS[(i // 7 + seed) % len(_TOPICS)]
        out.append({"speaker": ("Caroline", "Melanie")[i % 2], "timestamp": when.isoformat(),
                    "content": f"Turn {i}: I keep thinking about {topic}; it made my week, honestly."})
    return out


def run(conversations: int, messages: int, profile: bool = False, sort: str = "cumulative") -> dict[str, Any]:
    """Build ``conversations`` memories of ``messages`` turns each, one after another; returns the figures
    (and, with ``profile``, cProfile's top 25 lines by cumulative time under ``profile``)."""
    lm = ScriptedLM(default_responders())
    turns = [synthetic_messages(messages, seed=c) for c in range(conversations)]
    prof = cProfile.Profile() if profile else None
    settings = NemoriSettings(cache=False, _env_file=None)
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm, adapter=make_adapter(settings.adapter)):
        mem = Memory(SQLiteStore(Path(tmp) / "m.db"), HashingEmbedder(64), settings)
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        for c, msgs in enumerate(turns):
            mem.add_messages(f"user{c}", msgs)
            mem.flush(f"user{c}")
        seconds = time.perf_counter() - t0
        if prof:
            prof.disable()
        episodes = sum(len(mem.list_episodes(f"user{c}")) for c in range(conversations))
    total = conversations * messages
    figures = {"messages": total, "seconds": seconds, "msgs_per_s": total / seconds, "lm_calls": sum(lm.calls.values()),
               "lm_calls_per_stage": dict(lm.calls), "episodes": episodes}
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(25)
        figures["profile"] = buf.getvalue()
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table (and the profile), write ``results/framework_overhead.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--messages", type=int, default=200, help="turns per conversation")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    run(1, 20)  # warm-up: imports, DSPy's adapter caches
    f = run(a.conversations, a.messages, a.profile)
    if a.profile:
        print(f.pop("profile"))
    print(table(["measure", "figure", "target"], [
        ["messages through the full pipeline", f"{f['messages']:,}", ""],
        ["LLM calls (scripted, instant)", f"{f['lm_calls']:,}", ""],
        ["seconds", f"{f['seconds']:.2f}", ""],
        ["messages per second", f"{f['msgs_per_s']:,.0f}", f">= {TARGET_MSGS_PER_S:,.0f}"]]))
    path = write_result("framework_overhead", vars(a), f, a.out_dir)
    print(f"written {path}")
    return f


if __name__ == "__main__":
    main()
