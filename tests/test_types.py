"""Typed records' helpers: ``instant`` (the ordering key of naive and offset-carrying timestamps),
``span_union`` and the event span of a semantic entry."""

from datetime import datetime, timedelta, timezone

import pytest

from nemori_dspy.errors import InvalidInputError
from nemori_dspy.formatting import render_fact
from nemori_dspy.types import SemanticEntry, instant, span_union


def test_instant_reads_naive_in_the_given_zone_and_keeps_offsets():
    aware = datetime.fromisoformat("2023-05-24T23:30:00+08:00")
    assert instant(aware) == datetime(2023, 5, 24, 15, 30, tzinfo=timezone.utc)
    assert instant(datetime(2023, 5, 24, 15, 30)) == instant(aware)
    assert instant(datetime(2023, 5, 24, 23, 30), "Asia/Shanghai") == instant(aware)
    assert instant(aware).utcoffset() == timedelta(0)


def test_instant_names_an_unknown_zone():
    with pytest.raises(InvalidInputError, match="naive_timezone"):
        instant(datetime(2023, 5, 24), "Mars/Olympus")


def test_span_union_compares_instants_and_returns_the_timestamps_as_given():
    aware = datetime.fromisoformat("2023-05-24T23:30:00+08:00")  # 15:30 UTC
    naive_early, naive_late = datetime(2023, 5, 24, 15, 0), datetime(2023, 5, 24, 20, 0)
    start, end = span_union([(aware, aware), (naive_early, naive_late), (None, None)])
    assert start is naive_early and end is naive_late
    # read in Shanghai, naive 20:00 is 12:00 UTC: the aware 23:30+08:00 is then the latest
    assert span_union([(aware, aware), (naive_early, naive_late)], "Asia/Shanghai") == (naive_early, aware)
    assert span_union([(None, None)]) == (None, None) and span_union([]) == (None, None)


def test_a_semantic_entry_with_one_event_bound_gets_both_and_renders_its_dates():
    t = datetime(2023, 5, 8, 13, 56)
    e = SemanticEntry(id="s", user_id="u", text="Caroline adopted a dog.", event_start=t)
    assert e.event_end == t and render_fact(e) == "(2023-05-08) Caroline adopted a dog."
    span = e.model_copy(update={"event_end": datetime(2023, 6, 2, 9, 0)})
    assert render_fact(span) == "(2023-05-08 to 2023-06-02) Caroline adopted a dog."
    undated = SemanticEntry(id="s", user_id="u", text="Caroline adopted a dog.", created_at=datetime(2030, 1, 1))
    assert undated.event_start is None and render_fact(undated) == "Caroline adopted a dog."
