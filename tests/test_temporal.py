"""Relative dates resolved against the message timestamp (nemori_dspy/temporal.py)."""

from datetime import datetime, timezone

import pytest

from nemori_dspy.temporal import annotate_relative_dates, resolve_relative_date

SAID = datetime(2023, 5, 24, 10, 0)  # a Wednesday


@pytest.mark.parametrize("expr, expected", [
    ("yesterday", "23 May 2023"),
    ("the day before yesterday", "22 May 2023"),
    ("today", "24 May 2023"),
    ("tomorrow", "25 May 2023"),
    ("last night", "23 May 2023"),
    ("3 days ago", "21 May 2023"),
    ("two weeks ago", "the week of 10 May 2023"),
    ("last week", "the week of 17 May 2023"),
    ("last Saturday", "20 May 2023"),
    ("next Friday", "26 May 2023"),
    ("next month", "June 2023"),
    ("last year", "2022"),
    ("a few days ago", "21 May 2023"),
])
def test_resolve_relative_date(expr, expected):
    assert resolve_relative_date(expr, SAID) == expected


def test_annotation_follows_the_expression_and_keeps_the_text():
    out = annotate_relative_dates("I went to Paris last week, the Louvre was amazing!", SAID)
    assert out == "I went to Paris in the week of 17 May 2023 (last week), the Louvre was amazing!"


def test_no_second_preposition():
    assert annotate_relative_dates("Busy since last year", SAID) == "Busy since 2022 (last year)"
    assert annotate_relative_dates("Yesterday was fun", SAID) == "on 23 May 2023 (Yesterday) was fun"


def test_words_that_only_look_like_dates_are_left_alone():
    # dateparser.search reads "we" as Wednesday and "may" as May; the expression list does not
    text = "We may go hiking, I have been painting for 7 years now."
    assert annotate_relative_dates(text, SAID) == text


def test_the_reference_is_the_message_time_not_today():
    aware = datetime(2021, 3, 12, 9, 0, tzinfo=timezone.utc)
    assert annotate_relative_dates("Yesterday was fun", aware) == "on 11 March 2021 (Yesterday) was fun"


def test_strip_relative_notes_drops_only_the_relative_expressions_annotate_wrote():
    from nemori_dspy.temporal import strip_relative_notes

    assert strip_relative_notes("Camping in June 2023 (next month).") == "Camping in June 2023."
    assert strip_relative_notes("Mel (my friend) paints.") == "Mel (my friend) paints."
