"""The LoCoMo LLM judge as a DSPy metric (CORRECT → 1.0, WRONG → 0.0; Appendix D.4.1, mem0's rules).

The judge's model and prompt hash are part of every result: a reworded judge is not comparable.
"""

from __future__ import annotations

from typing import Any, Callable

import dspy

from nemori_dspy.errors import LLMError
from nemori_dspy.predict import StagePredict
from nemori_dspy.signatures import JudgeAnswer, signature_hash

__all__ = ["LLMJudge", "JUDGE_PROMPT_HASH"]

#: sha256[:12] of the judge signature's instruction and fields.
JUDGE_PROMPT_HASH = signature_hash(JudgeAnswer)


class LLMJudge:
    """Callable DSPy metric ``(example, pred, trace=None) -> float`` using ``JudgeAnswer``.

    ``example`` needs ``question`` and ``answer`` (gold); ``pred`` needs ``answer``.
    A judge call that fails after retries scores 0.0 and is counted in ``failures``.

    Args:
        lm: the judge LM (None = ``dspy.settings.lm``); configurable apart from the answer model.
        max_tokens: output cap for the judge's reasoning + label.
        model_label: what to log as the judge model (e.g. the GGUF file behind ``openai/local``).
    """

    def __init__(self, lm: dspy.BaseLM | None = None, max_tokens: int = 128, parse_retries: int = 1,
                 model_label: str | None = None) -> None:
        self.predict = StagePredict(JudgeAnswer, "judge", max_tokens=max_tokens, parse_retries=parse_retries, lm=lm)
        self.model = model_label or getattr(lm or dspy.settings.lm, "model", "unknown")
        self.prompt_hash = JUDGE_PROMPT_HASH
        self.failures = 0

    def label(self, question: str, gold: str, answer: str) -> str:
        """'CORRECT' or 'WRONG' ('WRONG' when the judge fails; see ``failures``)."""
        try:
            return str(self.predict(question=question, gold_answer=gold, generated_answer=answer).label)
        except LLMError:
            self.failures += 1
            return "WRONG"

    def __call__(self, example: Any, pred: Any, trace: Any = None) -> float:
        return 1.0 if self.label(example.question, str(example.answer), str(pred.answer)) == "CORRECT" else 0.0


JudgeFn = Callable[[Any, Any, Any], float]
