"""Judge audit: the LLM judge scored on a calibration set drawn from the run's own data.

The judge is a model too and can be wrong (a 0.5B judge marked "Denver" CORRECT for the gold
"Austin"). Beside its scores, every eval with a judge reports how the judge does on pairs whose
right label is known without asking a model:

* the gold answer given as the prediction — the judge must say CORRECT;
* a wrong answer — the judge must say WRONG. For LoCoMo that is the item's ``adversarial_answer``
  where it has one (only category-5 items do, and they are never scored, so in practice:) else the
  gold answer of another question of the same conversation that shares no token with this gold
  (same category first, then the next question after this one, wrapping). For LongMemEval it is the
  gold answer of another question of the same type (abstention and preference questions are left out:
  their references are an explanation and a rubric, not answers).

The set is capped (``NemoriSettings.judge_audit`` pairs, default 20; 0 = off) and drawn evenly
spaced over the scored questions, so it is deterministic and costs at most 2 × N judge calls per judge.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import dspy
from tqdm.auto import tqdm

from nemori_dspy.errors import RateLimitedError
from nemori_dspy.usage import tally
from nemori_dspy.eval.locomo import LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.locomo import stratified_questions
from nemori_dspy.eval.metrics import format_table, token_f1

__all__ = ["AuditPair", "locomo_audit_pairs", "longmemeval_audit_pairs", "evenly_spaced", "run_audit",
           "audit_table"]

log = logging.getLogger(__name__)

Metric = Callable[[Any, Any], float]
"""A DSPy judge metric ``(example, pred) -> 1.0 | 0.0`` (``LLMJudge``, ``LongMemEvalJudge``)."""


@dataclass(frozen=True)
class AuditPair:
    """One calibration item: the question as the judge reads it, its gold answer and a known-wrong answer.

    ``example`` carries what the judge needs (``question``, ``answer`` = gold, and for LongMemEval
    ``question_type`` / ``is_abstention``); ``wrong_source`` says where ``wrong`` came from
    (``"adversarial_answer"`` or ``"gold of <id>"``).
    """

    sample_id: str
    index: int | str
    question: str
    gold: str
    wrong: str
    wrong_source: str
    example: dspy.Example


def evenly_spaced(items: Sequence[Any], limit: int) -> list[Any]:
    """``limit`` items spread evenly over ``items`` (all of them when there are not more); 0 → none."""
    if limit <= 0:
        return []
    if len(items) <= limit:
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


def _distinct(wrong: str, gold: str) -> bool:
    """A usable wrong answer: non-empty and sharing no token with the gold (set-token F1 of 0)."""
    return bool(wrong.strip()) and token_f1(wrong, gold) == 0.0


def _locomo_wrong(q: LoCoMoQuestion, pool: list[LoCoMoQuestion]) -> tuple[str, str] | None:
    """(wrong answer, source) for ``q``: its adversarial answer, else another question's gold (see module doc)."""
    if q.adversarial_answer and _distinct(q.adversarial_answer, q.answer):
        return q.adversarial_answer, "adversarial_answer"
    size = max((o.index for o in pool), default=0) + 1
    others = sorted((o for o in pool if o.index != q.index and _distinct(o.answer, q.answer)),
                    key=lambda o: (o.category != q.category, (o.index - q.index) % size))
    return (others[0].answer, f"gold of {q.sample_id}#{others[0].index}") if others else None


def locomo_audit_pairs(conversations: Iterable[LoCoMoConversation], categories: Sequence[int],
                       max_questions: int | None, limit: int) -> list[AuditPair]:
    """The LoCoMo calibration set: up to ``limit`` pairs over the questions the run scores.

    Args:
        conversations: the run's (possibly sliced) conversations.
        categories: scored categories (``EvalOptions.categories``).
        max_questions: the per-conversation cap the run applies (None = all; stratified by category, as the run).
        limit: pairs in all (0 = no audit).

    Returns:
        Pairs in run order, evenly spaced over the eligible questions (those with a wrong answer).
    """
    eligible: list[AuditPair] = []
    for conv in conversations:
        pool = [o for o in conv.questions if o.answer]
        for q in stratified_questions([q for q in conv.questions if q.category in categories], max_questions):
            wrong = _locomo_wrong(q, pool)
            if wrong:
                eligible.append(AuditPair(q.sample_id, q.index, q.question, q.answer, *wrong,
                                          example=dspy.Example(question=q.question, answer=q.answer)))
    return evenly_spaced(eligible, limit)


def longmemeval_audit_pairs(questions: Sequence[Any], limit: int) -> list[AuditPair]:
    """The LongMemEval calibration set: up to ``limit`` pairs; the wrong answer is the gold of the next
    question of the same type (wrapping) that shares no token with this gold. Abstention and preference
    questions are skipped (their reference is not an answer).

    Args:
        questions: ``LongMemEvalQuestion`` objects the run scores, in run order.
        limit: pairs in all (0 = no audit).
    """
    from nemori_dspy.eval.longmemeval_judge import question_example

    usable = [q for q in questions if not q.is_abstention and q.question_type != "single-session-preference"]
    eligible: list[AuditPair] = []
    for i, q in enumerate(usable):
        ring = usable[i + 1:] + usable[:i]
        other = next((o for o in ring if o.question_type == q.question_type and _distinct(o.answer, q.answer)), None)
        if other is not None:
            eligible.append(AuditPair(q.question_id, 0, q.question, q.answer, other.answer,
                                      f"gold of {other.question_id}", example=question_example(q)))
    return evenly_spaced(eligible, limit)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def run_audit(judges: dict[str, Metric], pairs: Sequence[AuditPair], out: Path | None = None,
              progress: bool = False) -> dict[str, dict[str, float | int | None]]:
    """Score every pair with every judge (two judge calls per pair; ``progress`` shows a bar over the pairs).

    Returns ``{judge name: {"on_gold", "on_wrong", "overall", "n_gold", "n_wrong", "n"}}``: the share
    (in [0, 1]) of gold predictions labelled CORRECT, of wrong predictions labelled WRONG, and of both
    together. A judge call that fails counts as the judge's label WRONG (see ``LLMJudge.failures``); one refused
    for rate limits gives no verdict: that half of the pair is left out of the shares and its ``n`` (ledger
    counter ``judge_audit_rate_limited``; null in the JSON line).
    With ``out``, one JSON line per (judge, pair) is written there (what the judge got wrong, to read).
    """
    result: dict[str, dict[str, float | int | None]] = {}
    lines: list[str] = []
    for name, judge in judges.items():
        on_gold, on_wrong = [], []
        for p in tqdm(pairs, desc=f"judge audit ({name})", unit="pair", disable=not progress):
            gold, wrong = _verdict(judge, p.example, p.gold), _verdict(judge, p.example, p.wrong)
            gold_ok = None if gold is None else gold == 1.0
            wrong_ok = None if wrong is None else wrong == 0.0
            on_gold += [] if gold_ok is None else [float(gold_ok)]
            on_wrong += [] if wrong_ok is None else [float(wrong_ok)]
            row = {k: v for k, v in asdict(p).items() if k != "example"}
            lines.append(json.dumps({"judge": name, **row, "gold_judged_correct": gold_ok,
                                     "wrong_judged_wrong": wrong_ok}, default=str))
        result[name] = {"on_gold": _mean(on_gold), "on_wrong": _mean(on_wrong), "overall": _mean(on_gold + on_wrong),
                        "n_gold": len(on_gold), "n_wrong": len(on_wrong), "n": len(on_gold) + len(on_wrong)}
    if out is not None:
        out.write_text("".join(x + "\n" for x in lines))
    return result


def _verdict(judge: Metric, example: Any, answer: str) -> float | None:
    """``judge``'s score of ``answer``; None when the call was refused for rate limits (no verdict)."""
    try:
        return judge(example, dspy.Prediction(answer=answer))
    except RateLimitedError as exc:
        tally("judge_audit_rate_limited")
        log.warning("judge audit: no verdict (rate limited): %s", exc)
        return None


def _pct(value: float | None, n: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f} (n={n})"


def audit_table(audit: dict[str, dict[str, Any]]) -> str:
    """Text table of ``run_audit``'s result: one row per judge, accuracy ×100 with n."""
    body = [[name, _pct(a["on_gold"], a["n_gold"]), _pct(a["on_wrong"], a["n_wrong"]), _pct(a["overall"], a["n"])]
            for name, a in audit.items()]
    return format_table(["judge", "gold → CORRECT", "wrong → WRONG", "overall"], body, key_cols=1)
