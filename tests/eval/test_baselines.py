"""Baseline context budgets."""

from __future__ import annotations

from nemori_dspy.eval.baselines import ANSWER_RESERVE_TOKENS, CHARS_PER_TOKEN, CONTEXT_FILL, context_budget_chars


def test_the_baseline_budget_keeps_room_for_the_answer_prompt_and_a_margin():
    assert context_budget_chars(8192) == 21504  # (8192 - 1024) tokens × 4 chars × 3/4
    assert context_budget_chars(8192) < (8192 - ANSWER_RESERVE_TOKENS) * CHARS_PER_TOKEN
    assert context_budget_chars(ANSWER_RESERVE_TOKENS + 1000) == int(1000 * CHARS_PER_TOKEN * CONTEXT_FILL)
