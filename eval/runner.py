"""The LoCoMo main job: ingest each conversation as one user, answer categories 1-4 from memory and
with a no-memory control, score (LLM judge, F1, BLEU-1, LoCoMo F1), print tables, log to MLflow."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from tqdm.auto import tqdm

from ..config import NemoriSettings
from ..embedders import Embedder
from ..memory import Memory
from ..store.base import MemoryStore
from ..usage import LEDGER
from .judge import LLMJudge
from .locomo import CATEGORY_NAMES, SCORED_CATEGORIES, LoCoMoConversation, LoCoMoQuestion
from .metrics import bleu1, category_table, f1_locomo, token_f1

__all__ = ["EvalOptions", "ingest_conversation", "answer_questions", "episode_coverage", "run_locomo",
           "CONSTRUCTION_STAGES", "METRICS"]

log = logging.getLogger(__name__)

CONSTRUCTION_STAGES = ["partition", "narrate", "select", "integrate", "anticipate", "distill", "consolidate",
                       "direct_distill"]
METRICS = ["judge", "f1", "bleu1", "f1_locomo"]


@dataclass
class EvalOptions:
    """What to run: categories 1-4 by default, at most ``max_questions`` per conversation (None = all),
    the no-memory control and the LLM judge on or off."""

    categories: tuple[int, ...] = SCORED_CATEGORIES
    max_questions: int | None = None
    control: bool = True
    judge: bool = True
    progress: bool = True
    systems: list[str] = field(default_factory=lambda: ["nemori", "no-memory"])


def ingest_conversation(memory: Memory, conv: LoCoMoConversation, progress: bool = True) -> dict[str, Any]:
    """Add every turn (both speakers) as user ``conv.sample_id``, one window at a time, then one flush.

    Returns ``{"seconds", "reports": [...], "parked": [...]}``.
    """
    w = memory.settings.window_size
    t0 = time.perf_counter()
    parked: list[str] = []
    bar = tqdm(total=len(conv.messages), desc=f"ingest {conv.sample_id}", unit="msg", disable=not progress)

    def show(stage: str) -> None:  # an LLM call finished: show which stage and how many so far
        bar.set_postfix_str(f"{stage}, {LEDGER.total().calls} LLM calls", refresh=True)

    LEDGER.listeners.append(show)
    try:
        for i in range(0, len(conv.messages), w):
            chunk = conv.messages[i:i + w]
            res = memory.add_messages(conv.sample_id, chunk)
            parked += res.report.parked if res.report else []
            bar.update(len(chunk))
        report = memory.flush(conv.sample_id)
        parked += report.parked
    finally:
        LEDGER.listeners.remove(show)
        bar.close()
    return {"seconds": time.perf_counter() - t0, "parked": parked}


def episode_coverage(store: MemoryStore, user_id: str, message_ids: list[str]) -> dict[str, int]:
    """How many of ``message_ids`` sit in exactly one live episode, in none, or in several."""
    seen: dict[str, int] = {}
    for ep in store.list_episodes(user_id):
        for mid in ep.message_ids:
            seen[mid] = seen.get(mid, 0) + 1
    once = sum(1 for m in message_ids if seen.get(m) == 1)
    return {"messages": len(message_ids), "in_one_episode": once,
            "in_no_episode": sum(1 for m in message_ids if m not in seen),
            "in_several": sum(1 for m in message_ids if seen.get(m, 0) > 1),
            "episodes": len(store.list_episodes(user_id))}


def _score(q: LoCoMoQuestion, answer: str, judge: LLMJudge | None) -> dict[str, float]:
    ex = dspy.Example(question=q.question, answer=q.answer, category=q.category)
    pred = dspy.Prediction(answer=answer)
    scores = {"f1": token_f1(answer, q.answer), "bleu1": bleu1(answer, q.answer),
              "f1_locomo": f1_locomo(answer, q.answer, q.category)}
    if judge is not None:
        scores["judge"] = judge(ex, pred)
    return scores


def answer_questions(memory: Memory, conv: LoCoMoConversation, opts: EvalOptions,
                     judge: LLMJudge | None) -> list[dict[str, Any]]:
    """Answer the selected questions with memory (and without, if ``opts.control``); one row per answer."""
    qs = [q for q in conv.questions if q.category in opts.categories][: opts.max_questions]
    modes = [("nemori", True)] + ([("no-memory", False)] if opts.control else [])
    rows: list[dict[str, Any]] = []
    for q in tqdm(qs, desc=f"answer {conv.sample_id}", unit="q", disable=not opts.progress):
        for system, use_memory in modes:
            t0 = time.perf_counter()
            res = memory.answer(conv.sample_id, q.question, use_memory=use_memory)
            total_ms = (time.perf_counter() - t0) * 1000
            rows.append({"sample_id": q.sample_id, "index": q.index, "category": q.category,
                         "category_name": CATEGORY_NAMES[q.category], "system": system, "question": q.question,
                         "gold": q.answer, "answer": res.answer, "evidence": q.evidence,
                         "context_chars": len(res.context), "answer_input_tokens": res.usage.input_tokens,
                         "total_ms": round(total_ms, 1), **_score(q, res.answer, judge)})
    return rows


def run_locomo(memory: Memory, conversations: list[LoCoMoConversation], opts: EvalOptions,
               judge: LLMJudge | None, out_dir: Path) -> dict[str, Any]:
    """Ingest, answer, score; write ``results.jsonl``, ``tables.md`` and ``summary.json`` to ``out_dir``.

    Returns the summary: per-(system, category) means, per-stage usage, coverage, parked work.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    LEDGER.reset()
    rows: list[dict[str, Any]] = []
    coverage: dict[str, dict[str, int]] = {}
    parked: list[str] = []
    ingest_s = 0.0
    for conv in conversations:
        ing = ingest_conversation(memory, conv, opts.progress)
        ingest_s += ing["seconds"]
        parked += ing["parked"]
        coverage[conv.sample_id] = episode_coverage(memory.store, conv.sample_id, [m.id for m in conv.messages])
    construction = LEDGER.snapshot()
    for conv in conversations:
        rows += answer_questions(memory, conv, opts, judge)
    metrics = METRICS if judge is not None else [m for m in METRICS if m != "judge"]
    systems = ["nemori"] + (["no-memory"] if opts.control else [])
    summary = {
        "scores": _aggregate(rows, metrics, systems),
        "usage": {k: v.model_dump() for k, v in LEDGER.snapshot().items()},
        "construction_usage": {k: v.model_dump() for k, v in construction.items()},
        "counters": dict(LEDGER.counters),
        "coverage": coverage,
        "parked": parked,
        "ingest_seconds": round(ingest_s, 1),
        "questions": len({(r["sample_id"], r["index"]) for r in rows}),
        "judge": {"model": judge.model, "prompt_hash": judge.prompt_hash, "failures": judge.failures} if judge else None,
    }
    table = category_table(rows, metrics, systems)
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    (out_dir / "tables.md").write_text(f"## Scores (×100, n per cell)\n\n```\n{table}\n```\n\n"
                                       f"## LLM usage per stage\n\n```\n{LEDGER.table()}\n```\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    summary["table"] = table
    summary["usage_table"] = LEDGER.table()
    summary["rows"] = rows
    return summary


def _aggregate(rows: list[dict[str, Any]], metrics: list[str], systems: list[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        for cat in [*SCORED_CATEGORIES, "overall"]:
            sel = [r for r in mine if cat == "overall" or r["category"] == cat]
            name = cat if cat == "overall" else CATEGORY_NAMES[cat]
            for m in metrics:
                if sel:
                    out.setdefault(system, {})[f"{m}.{name}"] = sum(r[m] for r in sel) / len(sel)
            out.setdefault(system, {})[f"n.{name}"] = len(sel)
    return out
