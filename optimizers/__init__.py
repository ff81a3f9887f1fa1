"""Optimizers for the Nemori pipeline's stages (DSPy teleprompters wired to LoCoMo)."""

from nemori_dspy.optimizers.answer import AnswerProgram, OPTIMIZERS, evaluate_answer, locomo_answer_examples, make_optimizer, optimize_answer

__all__ = ["AnswerProgram", "OPTIMIZERS", "evaluate_answer", "locomo_answer_examples", "make_optimizer",
           "optimize_answer"]
