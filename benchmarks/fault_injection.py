"""Fault injection over one LoCoMo-schema conversation: a scripted LM fails ~20% of calls in mixed ways.

Failure kinds (chosen per call by a seeded RNG): provider timeout, HTTP 500, empty reply, truncated
reply, the output template echoed back, and a ``<think>…</think>`` prefix (which must still parse).
Processing is retried by calling ``flush`` again (parked work stays buffered); the run then checks
that every turn sits in exactly one episode and prints what failed, was retried and parked.

usage: python -m benchmarks.fault_injection [--rate 0.2] [--seed 7] [--data PATH]
(default data: the repo's tests/data/synthetic_mini.json, 56 turns; LoCoMo's own file works too, e.g.
``--data ../shared/data/locomo/locomo_mini.json``, 58 turns)
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
from collections import Counter
from pathlib import Path

import dspy

from benchmarks.results_io import cli_description
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.locomo import load_locomo
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.testing import ScriptedLM, replay_responders

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "tests/data/synthetic_mini.json"
KINDS = ("timeout", "http_500", "empty", "truncated", "schema_echo", "think_prefix")


def faulty(responders: dict, rate: float, seed: int, injected: Counter) -> dict:
    """Wrap every responder so that a share ``rate`` of calls misbehaves; counts kinds in ``injected``."""
    rng, lock = random.Random(seed), threading.Lock()

    def wrap(fn):
        def inner(inputs):
            with lock:
                kind = rng.choice(KINDS) if rng.random() < rate else None
            if kind:
                injected[kind] += 1
            if kind == "timeout":
                raise TimeoutError("simulated provider timeout")
            if kind == "http_500":
                raise ConnectionError("simulated HTTP 500 from provider")
            if kind == "empty":
                return ""
            good = fn(inputs)
            if kind == "truncated":
                return good[: len(good) // 3]
            if kind == "schema_echo":
                return "[[ ## cue ## ]]\n{cue}\n\n[[ ## narrative ## ]]\n{narrative}"
            if kind == "think_prefix":
                return "<think>Let me work this out.</think>\n" + good
            return good
        return inner

    return {k: wrap(v) for k, v in responders.items()}


def run(data: Path, rate: float, seed: int, max_flushes: int = 10) -> dict:
    """Ingest one conversation under injected faults; returns counts and the coverage check."""
    conv = load_locomo(data)[0]
    injected: Counter = Counter()
    lm = ScriptedLM(faulty(replay_responders(), rate, seed, injected))
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(Path(tmp) / "m.db"), HashingEmbedder(64), NemoriSettings(cache=False))
        parked = 0
        for i in range(0, len(conv.messages), 20):
            res = mem.add_messages(conv.sample_id, conv.messages[i:i + 20])
            parked += len(res.report.parked)
        flushes = 0
        while flushes < max_flushes:
            flushes += 1
            parked += len(mem.flush(conv.sample_id).parked)
            if not any(mem.store.stats(conv.sample_id)[k] for k in ("pending", "to_distill")):
                break
        ids = [m for ep in mem.list_episodes(conv.sample_id) for m in ep.message_ids]
        stats = mem.store.stats(conv.sample_id)
    calls = sum(lm.calls.values())
    return {"llm_calls": calls, "injected": dict(injected), "failed_calls": sum(injected.values()) - injected["think_prefix"],
            "retries": mem.usage.counters.get("retries", 0), "parked": parked, "flushes": flushes,
            "turns": len(conv.messages), "in_one_episode": sum(1 for m in set(ids) if ids.count(m) == 1),
            "duplicated": len(ids) - len(set(ids)), "lost": len(conv.messages) - len(set(ids)),
            "pending": stats["pending"], "to_distill": stats["to_distill"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    r = run(args.data, args.rate, args.seed)
    print(f"| {'measure':<28} | {'value':>8} |\n|{'-' * 30}|{'-' * 10}|")
    for k, v in r.items():
        if k == "injected":
            for kind in KINDS:
                print(f"| {'injected: ' + kind:<28} | {v.get(kind, 0):>8} |")
        else:
            print(f"| {k:<28} | {v:>8} |")


if __name__ == "__main__":
    main()
