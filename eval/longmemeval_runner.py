"""The LongMemEval harness: one memory per question (user = ``question_id``), answered by every selected
system with the same answer signature, scored by the per-type LongMemEval judges
(``eval/longmemeval_judge.py``), token F1 and BLEU-1, evidence recall@k; checkpointed and summarised per
question type like LoCoMo (same tables, resume, cost, judge audit, MLflow).

Each question is built through the LoCoMo machinery as a one-conversation haystack (``as_conversation``),
so memory reuse, ``--resume`` and the cost checkpoint behave exactly as for LoCoMo. The question is
asked at its ``question_date``: retrieval sees the bare question, P_ans sees it with the current date
(upstream's ``Current Date:`` line), which temporal questions ("how many days ago …") need.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nemori_dspy.memory import Memory
from nemori_dspy.usage import UsageLedger
from nemori_dspy.eval.baselines import RagIndex
from nemori_dspy.eval.judge import JudgePanel, as_panel
from nemori_dspy.eval.locomo import LoCoMoConversation
from nemori_dspy.eval.longmemeval import QUESTION_TYPES, LongMemEvalQuestion
from nemori_dspy.eval.longmemeval_judge import question_example, summarise_accuracy
from nemori_dspy.eval.metrics import Group, bleu1, token_f1
from nemori_dspy.eval.runner import (AnswerTask, EvalOptions, judge_verdicts, start_run, MemoryProvider, answer_tasks,
                                     system_context, context_tokens, recall_scores, summarise)
from nemori_dspy.eval.summary import RunResult
from nemori_dspy.eval.systems import System

__all__ = ["LONGMEMEVAL_GROUPS", "LONGMEMEVAL_SCORES", "as_conversation", "dated_question", "run_longmemeval"]

LONGMEMEVAL_GROUPS: list[Group] = [(t, lambda r, t=t: r["category"] == t) for t in QUESTION_TYPES] + [
    ("abstention", lambda r: bool(r.get("is_abstention")))]
"""Table groups: the six question types, then abstention questions (also counted in their type, as upstream)."""

LONGMEMEVAL_SCORES = ["f1", "bleu1"]
"""LLM-free scores beside the judge (None for abstention and preference questions: their reference is an
explanation or a rubric, not an answer)."""


def as_conversation(q: LongMemEvalQuestion) -> LoCoMoConversation:
    """``q``'s haystack as a one-user conversation (``sample_id`` = ``question_id``) for the shared builder."""
    return LoCoMoConversation(sample_id=q.user_id, speaker_a="user", speaker_b="assistant", messages=q.messages,
                              questions=[])


def dated_question(q: LongMemEvalQuestion) -> str:
    """The question as P_ans sees it: ``"<question>\\n(Current date: 2023/05/30 (Tue) 23:40)"``."""
    return f"{q.question}\n(Current date: {q.question_date:%Y/%m/%d (%a) %H:%M})"


def _scores(q: LongMemEvalQuestion, answer: str, panel: JudgePanel | None) -> dict[str, Any]:
    answerable = not q.is_abstention and q.question_type != "single-session-preference"
    out: dict[str, Any] = {"f1": token_f1(answer, q.answer) if answerable else None,
                           "bleu1": bleu1(answer, q.answer) if answerable else None}
    if panel is not None:
        out.update(judge_verdicts(panel, question_example(q), answer))
    return out


def _row(system: System, memory: Memory, q: LongMemEvalQuestion, conv: LoCoMoConversation, rag: RagIndex | None,
         panel: JudgePanel | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    with memory.usage.charging():
        context, ranked, search_ms = system_context(system, memory, conv, q.question, rag)
    with memory.usage.scope() as mine:
        answer = memory.pipeline(user_id=conv.sample_id, question=dated_question(q), context=context).answer
    usage = mine.total()
    return {"sample_id": q.question_id, "index": 0, "category": q.question_type, "category_name": q.question_type,
            "is_abstention": q.is_abstention, "system": system.name, "question": q.question,
            "question_date": q.question_date.isoformat(), "gold": q.answer, "answer": answer,
            "evidence": q.evidence, "context_chars": len(context), "context_tokens": context_tokens(context),
            "answer_input_tokens": usage.input_tokens, "answer_output_tokens": usage.output_tokens,
            "search_ms": round(search_ms, 1), "total_ms": round((time.perf_counter() - t0) * 1000, 1),
            **recall_scores(ranked, q.evidence), **_scores(q, answer, panel)}


def _upstream_metrics(rows: list[dict[str, Any]], systems: list[str], judged: list[str]) -> dict[str, Any]:
    """``{system: {judge metric: summarise_accuracy(...)}}``: overall, task-averaged and abstention accuracy."""
    return {s: {m: summarise_accuracy((r["category"], bool(r["is_abstention"]), r[m]) for r in rows
                                      if r["system"] == s and r.get(m) is not None) for m in judged}
            for s in systems}


def run_longmemeval(memories: Memory | MemoryProvider, questions: list[LongMemEvalQuestion], opts: EvalOptions,
                    judge: Any, out_dir: Path) -> RunResult:
    """Build one memory per question, answer, score; write ``results.jsonl`` (checkpointed), ``cost.json``,
    ``tables.md``, ``summary.json`` and (with a judge audit) ``judge_audit.jsonl``.

    Args:
        memories: one ``Memory`` for every system, or a provider (e.g. ``CachedMemories``).
        questions: the questions to run (``load_longmemeval``), in order; ``opts.max_questions`` is not
            applied here (cut the list).
        opts: systems, resume, concurrency, progress (``categories`` is LoCoMo's and ignored).
        judge: a ``JudgePanel`` of ``LongMemEvalJudge`` (``judge``) with its audit pairs, a bare judge, or None.
        out_dir: the run folder.

    Returns:
        The ``RunResult`` as for ``run_locomo`` (scores per question type, ``abstention`` and ``overall``), plus
        ``longmemeval``: upstream's overall / task-averaged / abstention accuracy per system and judge
        (also as ``<judge>.task-averaged`` in ``scores``). Usage is this run's alone (its own ledger).
    """
    ledger = UsageLedger()
    with ledger.charging():
        return _run_longmemeval(memories, questions, opts, as_panel(judge), out_dir, ledger)


def _run_longmemeval(memories: Memory | MemoryProvider, questions: list[LongMemEvalQuestion], opts: EvalOptions,
                     panel: JudgePanel | None, out_dir: Path, ledger: UsageLedger) -> RunResult:
    convs = [as_conversation(q) for q in questions]
    provider, ckpt, cost, built, construction, base, rag, skipped = start_run(memories, convs, opts, out_dir, ledger)
    memories_of = {s.name: provider.memory(s) for s in opts.systems}  # resolved here, not in the answer threads
    tasks = [AnswerTask((system.name, q.question_id, 0), f"answer {q.question_id} {system.name}",
                        {"question": q.question_id, "system": system.name},
                        lambda s=system, q=q, c=conv: _row(s, memories_of[s.name], q, c, rag, panel))
             for q, conv in zip(questions, convs) for system in opts.systems]
    seconds = answer_tasks(tasks, ckpt, opts, base.settings.num_retries,
                           after_each=lambda row: cost.save(construction, built))
    construction, built = cost.carry_over(construction, built)
    groups = [g for g in LONGMEMEVAL_GROUPS if any(g[1](r) for r in ckpt.rows)]  # the types this run has
    summary = summarise(ckpt.rows, opts, panel, built, construction, skipped, out_dir, ledger,
                         local=base.settings.model == "local", groups=groups, scores=LONGMEMEVAL_SCORES,
                         answer_seconds=seconds)
    upstream = _upstream_metrics(ckpt.rows, summary.systems, summary.judge_metrics)
    for system, by_metric in upstream.items():
        for metric, acc in by_metric.items():
            if acc["task_averaged"] is not None:
                summary.scores.setdefault(system, {})[f"{metric}.task-averaged"] = acc["task_averaged"]
    summary.longmemeval, summary.benchmark = upstream, "LongMemEval"
    summary.write(out_dir / "summary.json")
    return summary
