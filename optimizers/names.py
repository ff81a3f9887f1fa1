"""Optimizer names, apart from ``optimize.py`` so the CLI parser lists them without importing dspy."""

from __future__ import annotations

__all__ = ["OPTIMIZERS"]

#: optimizer names accepted by ``optimize.make_optimizer`` (the ones dspy 3.4 ships).
OPTIMIZERS: tuple[str, ...] = ("bootstrap", "labeled", "mipro", "gepa", "simba")
