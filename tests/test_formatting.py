"""Prompt rendering: per-message clipping under a prompt budget, with a floor."""

from __future__ import annotations

from datetime import datetime

from nemori_dspy.formatting import MIN_MESSAGE_CHARS, per_message_chars, render_messages
from nemori_dspy.types import StoredMessage


def test_messages_share_the_budget_but_are_never_clipped_below_the_floor():
    assert per_message_chars(10, 4000, 12000) == 1200
    assert per_message_chars(100, 4000, 12000) == MIN_MESSAGE_CHARS  # 120 each would fit; the floor wins
    assert per_message_chars(3, 4000, None) == 4000


def test_a_crowded_prompt_keeps_the_floor_of_every_message():
    msgs = [StoredMessage(id=f"m{i}", user_id="u", seq=i + 1, speaker="Ann", content="x" * 1000,
                          timestamp=datetime(2023, 5, 7, 13, i)) for i in range(40)]
    lines = render_messages(msgs, max_chars=4000, budget=2000).splitlines()
    assert len(lines) == 40 and all(line.count("x") == MIN_MESSAGE_CHARS for line in lines)
