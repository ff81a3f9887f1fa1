"""Deterministic rules for insights that are not facts: questions, chat lines, verbatim copies of a message."""

from __future__ import annotations

import pytest

from nemori_dspy.insight_rules import message_lines, not_a_fact

EPISODE = "\n".join([
    "[2023-05-08 13:56] Caroline: I went to a LGBTQ support group on 7 May 2023 (yesterday) and it was so powerful.",
    "[2023-05-08 13:57] Melanie: Wow, that's cool! What happened that was so awesome?",
    "[2023-05-08 13:58] Caroline: I'm keen on counseling or working in mental health.",
])


def test_rendered_lines_give_speaker_and_content():
    assert message_lines(EPISODE)[2] == ("Caroline", "I'm keen on counseling or working in mental health.")
    assert message_lines("3. [2023-05-08 13:56] Bob: hi\nnot a message") == [("Bob", "hi")]


def test_lines_under_a_shared_time_line_are_read_and_the_time_line_skipped():
    compact = "[2023-05-08 13:56]\nCaroline: I'm keen on counseling.\n2. Melanie: Great: go for it\n[2023-05-08 18:00]"
    assert message_lines(compact) == [("Caroline", "I'm keen on counseling."), ("Melanie", "Great: go for it")]
    assert not_a_fact("I'm keen on counseling", compact) == "verbatim_copy"


@pytest.mark.parametrize("insight,reason", [
    ("What happened that was so awesome?", "question"),
    ("Did Melanie hear any inspiring stories?\"", "question"),
    ("Caroline: I went to a LGBTQ support group yesterday.", "chat_line"),
    ("melanie: Wow, that's cool!", "chat_line"),
    ("I'm keen on counseling or working in mental health", "verbatim_copy"),
    ("I went to a LGBTQ support group on 7 May 2023 (yesterday) and it was so powerful!", "verbatim_copy"),
])
def test_what_is_not_a_fact_is_named(insight, reason):
    assert not_a_fact(insight, EPISODE) == reason


@pytest.mark.parametrize("insight", [
    "Caroline went to an LGBTQ support group on 7 May 2023.",
    "Caroline is keen on counseling or working in mental health.",  # names her: a fact, though close to her line
    "Caroline said: I'm keen on counseling or working in mental health.",
    "Melanie asked what happened at the group",
])
def test_facts_are_kept(insight):
    assert not_a_fact(insight, EPISODE) is None
