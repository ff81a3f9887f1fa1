"""The LongMemEval LLM judge as a DSPy metric (yes → 1.0, no → 0.0), routed per question type.

Mirrors upstream ``src/evaluation/evaluate_qa.py``: abstention questions (id ending in ``_abs``)
use the abstention prompt whatever their type; other questions use their type's prompt (see
``nemori_dspy.signatures.longmemeval``). The judge's model and prompt hash are part of every
result: a reworded judge is not comparable. ``summarise_accuracy`` computes the three metrics
upstream reports (overall, task-averaged, abstention accuracy).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Iterable

import dspy

from nemori_dspy.errors import InvalidInputError, LLMError, RateLimitedError
from nemori_dspy.predict import StagePredict
from nemori_dspy.signatures import signature_hash
from nemori_dspy.signatures.longmemeval import LONGMEMEVAL_JUDGE_SIGNATURES, JudgeLongMemEvalAbstention
from nemori_dspy.eval.longmemeval import ABSTENTION_SUFFIX, QUESTION_TYPES, LongMemEvalQuestion

#: guards the judges' counters: an eval judges answers from several threads.
_COUNT_LOCK = threading.Lock()

__all__ = [
    "LongMemEvalJudge",
    "LONGMEMEVAL_JUDGE_PROMPT_HASH",
    "judge_signature",
    "question_example",
    "summarise_accuracy",
]

log = logging.getLogger(__name__)

#: one sha256[:12] over the five judge signatures (each signature's own hash, sorted by name).
LONGMEMEVAL_JUDGE_PROMPT_HASH = hashlib.sha256(
    "\n".join(f"{s.__name__}={signature_hash(s)}" for s in
              sorted(set(LONGMEMEVAL_JUDGE_SIGNATURES.values()), key=lambda s: s.__name__)).encode()
).hexdigest()[:12]

#: signature → name of its reference-answer input field (the gold answer, rubric or explanation).
_GOLD_FIELD: dict[type[dspy.Signature], str] = {
    sig: next(n for n in ("gold_answer", "rubric", "explanation") if n in sig.input_fields)
    for sig in set(LONGMEMEVAL_JUDGE_SIGNATURES.values())
}


def judge_signature(question_type: str, is_abstention: bool = False) -> type[dspy.Signature]:
    """The judge signature for a question: the abstention one if ``is_abstention``, else its type's.

    Raises:
        InvalidInputError: ``question_type`` is not one of ``QUESTION_TYPES`` (and not abstention).
    """
    if is_abstention:
        return JudgeLongMemEvalAbstention
    if question_type not in QUESTION_TYPES:
        raise InvalidInputError("example.question_type", f"unknown LongMemEval question type {question_type!r}",
                                f"use one of {list(QUESTION_TYPES)}")
    return LONGMEMEVAL_JUDGE_SIGNATURES[question_type]


def question_example(q: LongMemEvalQuestion) -> dspy.Example:
    """A ``dspy.Example`` for ``q`` with the fields ``LongMemEvalJudge`` reads (input: ``question``)."""
    return dspy.Example(question=q.question, answer=q.answer, question_type=q.question_type,
                        question_id=q.question_id, is_abstention=q.is_abstention,
                        question_date=q.question_date.isoformat()).with_inputs("question")


class LongMemEvalJudge:
    """Callable DSPy metric ``(example, pred, trace=None) -> float`` with the per-type LongMemEval judge.

    ``example`` needs ``question``, ``answer`` (gold answer, rubric or abstention explanation) and
    ``question_type``; abstention is read from ``example.is_abstention`` if set, else from
    ``example.question_id`` ending in ``_abs``. ``pred`` needs ``answer``. A judge call that fails
    after retries scores 0.0 and is counted in ``failures``. ``calls`` counts calls per signature name.

    Args:
        lm: the judge LM (None = ``dspy.settings.lm``); configurable apart from the answer model.
        max_tokens: output cap for the label (upstream uses 10 for a bare yes/no; the adapter's
            field markers need a little more).
        parse_retries: re-asks after a reply that does not parse.
        model_label: what to log as the judge model (e.g. the GGUF file behind ``openai/local``).
    """

    def __init__(self, lm: dspy.BaseLM | None = None, max_tokens: int = 32, parse_retries: int = 1,
                 model_label: str | None = None) -> None:
        self.predictors: dict[type[dspy.Signature], StagePredict] = {
            sig: StagePredict(sig, "judge", max_tokens=max_tokens, parse_retries=parse_retries, lm=lm)
            for sig in set(LONGMEMEVAL_JUDGE_SIGNATURES.values())
        }
        self.model = model_label or getattr(lm or dspy.settings.lm, "model", "unknown")
        self.prompt_hash = LONGMEMEVAL_JUDGE_PROMPT_HASH
        self.prompt_hashes = {sig.__name__: signature_hash(sig) for sig in self.predictors}
        self.failures = 0
        self.calls: dict[str, int] = {}
        log.info("LongMemEval judge: model=%s prompt_hash=%s (%s)", self.model, self.prompt_hash,
                 ", ".join(f"{k}={v}" for k, v in sorted(self.prompt_hashes.items())))

    def label(self, question_type: str, question: str, gold: str, answer: str, is_abstention: bool = False) -> bool:
        """True if the judge says yes (False when the judge fails; see ``failures``).

        Raises:
            InvalidInputError: unknown ``question_type``.
            RateLimitedError: the provider refused the judge call for rate limits (after litellm's retries).
        """
        sig = judge_signature(question_type, is_abstention)
        with _COUNT_LOCK:
            self.calls[sig.__name__] = self.calls.get(sig.__name__, 0) + 1
        inputs = {"question": question, _GOLD_FIELD[sig]: gold, "generated_answer": answer}
        try:
            return str(self.predictors[sig](**inputs).label).strip().lower() == "yes"
        except RateLimitedError:  # no verdict, not a "no": the eval asks again later
            raise
        except LLMError:
            with _COUNT_LOCK:
                self.failures += 1
            return False

    def __call__(self, example: Any, pred: Any, trace: Any = None) -> float:
        abstention = getattr(example, "is_abstention", None)
        if abstention is None:
            abstention = str(getattr(example, "question_id", "")).endswith(ABSTENTION_SUFFIX)
        ok = self.label(str(example.question_type), example.question, str(example.answer), str(pred.answer),
                        is_abstention=bool(abstention))
        return 1.0 if ok else 0.0


def summarise_accuracy(rows: Iterable[tuple[str, bool, float]]) -> dict[str, Any]:
    """Upstream's metrics from ``(question_type, is_abstention, score)`` rows (``print_qa_metrics.py``).

    Returns ``{"overall", "task_averaged", "abstention", "per_type", "counts"}``: overall is the mean
    of all scores; per-type means include abstention questions of that type; task-averaged is the
    mean of the per-type means over the types present; abstention is the mean over ``_abs``
    questions (None when there are none, as for empty inputs).
    """
    per: dict[str, list[float]] = {}
    abst: list[float] = []
    for qtype, is_abs, score in rows:
        per.setdefault(qtype, []).append(float(score))
        if is_abs:
            abst.append(float(score))
    scores = [s for v in per.values() for s in v]
    per_type = {t: sum(v) / len(v) for t, v in per.items()}

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "overall": mean(scores),
        "task_averaged": mean(list(per_type.values())),
        "abstention": mean(abst),
        "per_type": per_type,
        "counts": {t: len(v) for t, v in per.items()} | {"abstention": len(abst)},
    }
