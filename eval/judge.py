"""The LoCoMo LLM judges as DSPy metrics (CORRECT → 1.0, WRONG → 0.0; Appendix D.4.1, mem0's rules).

Two prompts: the generous ``JudgeAnswer`` (mem0's; scores as ``judge``) and our ``JudgeAnswerStrict``
(scores as ``judge_strict``): published LoCoMo numbers move from 91% to 35% between judge prompts, so a
run can report both. The judge's model and prompt hash are part of every result: a reworded judge is not
comparable.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

import dspy
from pydantic import BaseModel, Field

from nemori_dspy.errors import LLMError, RateLimitedError
from nemori_dspy.junk import STOP_WORDS
from nemori_dspy.predict import StagePredict
from nemori_dspy.signatures import JudgeAnswer, JudgeAnswerStrict, signature_hash
from nemori_dspy.usage import tally

__all__ = ["LLMJudge", "Verdict", "known_wrong", "JUDGE_PROMPT_HASH", "JUDGE_STRICT_PROMPT_HASH", "JUDGE_METRICS", "JudgePanel",
           "as_panel"]

#: sha256[:12] of the judge signature's instruction and fields.
JUDGE_PROMPT_HASH = signature_hash(JudgeAnswer)
#: sha256[:12] of the strict judge signature.
JUDGE_STRICT_PROMPT_HASH = signature_hash(JudgeAnswerStrict)
#: guards the judges' counters: an eval judges answers from several threads (module-level, so a judge still
#: deep-copies and pickles).
_COUNT_LOCK = threading.Lock()
#: ``--judge`` choice → the score names it produces.
JUDGE_METRICS = {"generous": ["judge"], "strict": ["judge_strict"], "both": ["judge", "judge_strict"]}


class Verdict(BaseModel):
    """One judge's verdict on one answer: what a score of 1.0 / 0.0 stands for, with the judge's reasons."""

    label: Literal["CORRECT", "WRONG"] = Field(description="CORRECT scores 1.0, WRONG 0.0")
    rationale: str | None = Field(default=None, description="the judge's one-sentence reasoning, when it gives one")
    findings: dict[str, bool] = Field(default_factory=dict, description="the strict judge's checks: "
                                      "key_facts_present, contradicts_gold")
    overridden: bool = Field(default=False, description="the strict judge said CORRECT against its own findings; "
                             "the guard made it WRONG")
    failed: bool = Field(default=False, description="the judge gave no usable reply after its retries (WRONG)")
    rule: str | None = Field(default=None, description="the known-wrong rule that decided WRONG without a judge "
                             "call (``known_wrong``: 'empty', 'restates_question'), else None")

    @property
    def score(self) -> float:
        """1.0 for CORRECT, 0.0 for WRONG."""
        return 1.0 if self.label == "CORRECT" else 0.0


_WORD = re.compile(r"\w+")


@lru_cache(maxsize=4096)
def _stem(word: str) -> str:
    from nltk.stem import PorterStemmer

    return PorterStemmer().stem(word)


def _content_stems(text: str) -> set[str]:
    """Porter stems of the words of ``text`` that are not ``junk.STOP_WORDS`` (digits kept: "2" is content)."""
    return {_stem(w) for w in _WORD.findall(str(text).casefold()) if w not in STOP_WORDS}


def known_wrong(question: str, gold: str, answer: str) -> str | None:
    """Why ``answer`` is WRONG without asking a judge model, or None (the model decides).

    * ``"empty"``: no answer at all (an answer stage that failed is scored as an empty answer);
    * ``"restates_question"``: the answer has two or more content words and every one is the question's (Porter stems,
      ``junk.STOP_WORDS`` ignored) while the gold has a content word the question lacks, so the answer cannot
      hold it: "Sam agreed to try instead of soda and candy." to "What did Sam agree to try instead of soda and
      candy?" (gold: flavored seltzer water). Answers the question itself spells out ("camping trip" to "…walking
      tours or a camping trip?"), one-word answers ("Prius" to "…after his old Prius broke down?", gold "new Prius")
      and bare yes/no answers go to the model.

    A small judge model marks such answers CORRECT: of the 200 answers of the conv-49 ablation
    (benchmarks/results/ablation-local_0.5b-memory-20261204-135954.json) the 1.5B judge called 4 of 14 empty
    answers and 2 of 4 restated questions CORRECT.
    """
    if not str(answer).strip():
        return "empty"
    said, asked = _content_stems(answer), _content_stems(question)
    if len(said) >= 2 and said <= asked and _content_stems(gold) - asked:
        return "restates_question"
    return None


class LLMJudge:
    """Callable DSPy metric ``(example, pred, trace=None) -> float`` using ``JudgeAnswer`` (or, with
    ``strict``, ``JudgeAnswerStrict``).

    ``example`` needs ``question`` and ``answer`` (gold); ``pred`` needs ``answer``.
    A judge call that fails after retries scores 0.0 and is counted in ``failures``; one refused for rate limits
    raises ``RateLimitedError`` instead (no verdict is not a WRONG verdict: the eval asks again later).
    Thread-safe: an eval judges answers from several threads. The strict judge's
    label is checked against its own findings: CORRECT stands only if it also said the key facts are
    present and nothing contradicts the gold (a deterministic guard; overrides counted as the ledger
    counter ``judge_strict_overrides``). An answer ``known_wrong`` rules out (empty, or restating the question)
    is WRONG without a call (counted as ``judge_known_wrong.<rule>``).

    Args:
        lm: the judge LM (None = ``dspy.settings.lm``); configurable apart from the answer model.
        max_tokens: output cap for the judge's reasoning + label.
        model_label: what to log as the judge model (e.g. the GGUF file behind ``openai/local``).
        strict: use the strict prompt (ledger stage ``judge_strict``).
    """

    def __init__(self, lm: dspy.BaseLM | None = None, max_tokens: int = 128, parse_retries: int = 1,
                 model_label: str | None = None, strict: bool = False) -> None:
        sig, stage = (JudgeAnswerStrict, "judge_strict") if strict else (JudgeAnswer, "judge")
        self.strict = strict
        self.predict = StagePredict(sig, stage, max_tokens=max_tokens, parse_retries=parse_retries, lm=lm)
        self.model = model_label or getattr(lm or dspy.settings.lm, "model", "unknown")
        self.prompt_hash = signature_hash(sig)
        self.failures = 0

    def verdict(self, question: str, gold: str, answer: str) -> Verdict:
        """The judge's ``Verdict``: label, reasoning (generous judge) or findings (strict judge); WRONG with
        ``failed`` when the judge fails (see ``failures``).

        Raises:
            RateLimitedError: the provider refused the judge call for rate limits (after litellm's retries).
        """
        rule = known_wrong(question, gold, answer)
        if rule:
            tally(f"judge_known_wrong.{rule}")
            return Verdict(label="WRONG", rule=rule)
        try:
            pred = self.predict(question=question, gold_answer=gold, generated_answer=answer)
        except RateLimitedError:
            raise
        except LLMError:
            with _COUNT_LOCK:
                self.failures += 1
            return Verdict(label="WRONG", failed=True)
        label = "CORRECT" if str(pred.label) == "CORRECT" else "WRONG"
        if not self.strict:
            return Verdict(label=label, rationale=str(getattr(pred, "reasoning", "") or "") or None)
        findings = {"key_facts_present": bool(pred.key_facts_present), "contradicts_gold": bool(pred.contradicts_gold)}
        if label == "CORRECT" and (not findings["key_facts_present"] or findings["contradicts_gold"]):
            tally("judge_strict_overrides")
            return Verdict(label="WRONG", findings=findings, overridden=True)
        return Verdict(label=label, findings=findings)

    def label(self, question: str, gold: str, answer: str) -> str:
        """'CORRECT' or 'WRONG' ('WRONG' when the judge fails; see ``failures``)."""
        return self.verdict(question, gold, answer).label

    def assess(self, example: Any, pred: Any) -> Verdict:
        """``verdict`` of ``pred.answer`` to ``example`` (``question``, ``answer`` = gold)."""
        return self.verdict(example.question, str(example.answer), str(pred.answer))

    def __call__(self, example: Any, pred: Any, trace: Any = None) -> float:
        return self.assess(example, pred).score



class JudgePanel:
    """The judges of one eval run and the calibration set they are audited on (``eval/judge_audit.py``).

    Args:
        judges: metric name → judge metric ``(example, pred) -> float`` with ``model``, ``prompt_hash``
            and ``failures`` attributes (``LLMJudge``, ``LongMemEvalJudge``); e.g. ``{"judge": generous}``.
            Each name becomes a score column (``judge``, ``judge_strict``).
        audit: calibration pairs (``judge_audit.AuditPair``); empty = no audit.
    """

    def __init__(self, judges: dict[str, Any], audit: Sequence[Any] = ()) -> None:
        self.judges, self.audit_pairs = dict(judges), list(audit)

    @property
    def metrics(self) -> list[str]:
        """The score names this panel adds to every row, in order."""
        return list(self.judges)

    def score(self, example: Any, answer: str) -> dict[str, float]:
        """``{metric name: 1.0 | 0.0}`` for one answer to ``example``."""
        return {name: v.score for name, v in self.assess(example, answer).items()}

    def assess(self, example: Any, answer: str) -> dict[str, Verdict]:
        """``{metric name: Verdict}`` for one answer to ``example``: a judge with an ``assess`` method gives its
        reasons (``LLMJudge``), any other judge metric its label only (1.0 → CORRECT)."""
        pred = dspy.Prediction(answer=answer)
        out = {}
        for name, judge in self.judges.items():
            assess = getattr(judge, "assess", None)
            out[name] = assess(example, pred) if assess else \
                Verdict(label="CORRECT" if judge(example, pred) == 1.0 else "WRONG")
        return out

    def info(self) -> dict[str, dict[str, Any]]:
        """``{metric name: {"model", "prompt_hash", "failures"}}``: what makes each judge's scores comparable."""
        return {name: {"model": j.model, "prompt_hash": j.prompt_hash, "failures": j.failures}
                for name, j in self.judges.items()}

    def run_audit(self, out: Path | None = None, progress: bool = False) -> dict[str, dict[str, Any]] | None:
        """Every judge on the calibration set (``judge_audit.run_audit``, a bar over the pairs with ``progress``);
        None without pairs."""
        from nemori_dspy.eval.judge_audit import run_audit

        return run_audit(self.judges, self.audit_pairs, out, progress) if self.audit_pairs else None


def as_panel(judge: Any) -> JudgePanel | None:
    """``None`` → None, a ``JudgePanel`` as is, a single judge → a panel scoring it as ``judge`` (no audit)."""
    if judge is None or isinstance(judge, JudgePanel):
        return judge
    return JudgePanel({"judge": judge})
