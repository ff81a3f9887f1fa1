"""Optimizers for the Nemori pipeline's stages (DSPy teleprompters wired to LoCoMo).

The names below load on first use (PEP 562): importing a light submodule such as
``nemori_dspy.optimizers.names`` (the CLI parser does) does not import dspy.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["AnswerProgram", "OPTIMIZERS", "evaluate_answer", "locomo_answer_examples", "make_optimizer",
           "optimize_answer"]


def __getattr__(name: str) -> Any:
    """``nemori_dspy.optimizers.<name>`` for a name in ``__all__``: imported from ``optimizers/answer.py``.

    Raises:
        AttributeError: ``name`` is not in ``__all__``.
    """
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("nemori_dspy.optimizers.answer"), name)
    globals()[name] = value
    return value
