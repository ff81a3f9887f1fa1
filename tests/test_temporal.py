"""Relative dates resolved against the message timestamp (nemori_dspy/temporal.py)."""

from datetime import datetime, timezone

import pytest

from datetime import date

from nemori_dspy.temporal import (annotate_relative_dates, date_spans, dates_agree, resolve_relative_date,
                                   spans_overlap)

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


def test_date_spans_reads_days_weeks_months_years_and_a_bare_day_in_a_given_year():
    text = "on 20 May 2023 (last Saturday), in the week of 8 May 2023, in June 2023, in 2018, on 2023-05-07, 2 February"
    assert date_spans(text) == [(date(2023, 5, 20), date(2023, 5, 20)), (date(2023, 5, 8), date(2023, 5, 14)),
                                (date(2023, 6, 1), date(2023, 6, 30)), (date(2018, 1, 1), date(2018, 12, 31)),
                                (date(2023, 5, 7), date(2023, 5, 7))]
    assert date_spans("born on 2 February", year=2023) == [(date(2023, 2, 2), date(2023, 2, 2))]
    assert date_spans("on 31 February 2023 at 20 past") == []


@pytest.mark.parametrize("claim, source, sent, agree", [
    ("Sofia got married in June 2023.", "we got married in 2018 (5 years ago)", "June 2023", False),
    ("Sofia got married in 2018.", "we got married in 2018 (5 years ago)", "June 2023", True),
    ("Priya hiked on 21 May 2023.", "I hiked on 20 May 2023 (last Saturday)", "May 2023", False),
    ("Priya hiked in May 2023.", "I hiked on 20 May 2023 (last Saturday)", "May 2023", True),
    ("Priya hiked on 21 May 2023.", "I hiked the ridge", "May 2023", True),  # undated message: its send month
    ("Priya hiked on 21 July 2023.", "I hiked the ridge", "May 2023", False),
    ("On 8 May 2023 Ana said she went on 7 May 2023.", "I went on 7 May 2023 (yesterday)", "May 2023", True),
    ("Elias's daughter was born on 2 February 2023.", "she was born on 2 February", "March 2023", True),
    ("Priya hiked the ridge.", "I hiked on 20 May 2023 (last Saturday)", "May 2023", True),  # no date claimed
])
def test_dates_agree_needs_the_event_date_the_message_gives(claim, source, sent, agree):
    assert dates_agree(claim, source, sent) is agree


def test_spans_overlap_is_inclusive_at_both_ends():
    june = (date(2023, 6, 1), date(2023, 6, 30))
    assert spans_overlap(june, (date(2023, 6, 30), date(2023, 7, 6)))  # shares the last day
    assert spans_overlap((date(2023, 6, 8), date(2023, 6, 8)), june)
    assert not spans_overlap(june, (date(2023, 7, 1), date(2023, 7, 1)))
