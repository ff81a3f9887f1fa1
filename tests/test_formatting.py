"""Rendering helpers: per-message clipping under a prompt budget (with a floor), batched-stage inputs and the
token-capped answer context (``fit_context``)."""

from __future__ import annotations

from datetime import datetime

import pytest

from nemori_dspy.formatting import (CONTEXT_HEADERS, MIN_MESSAGE_CHARS, fit_context, per_message_chars,
                                    render_context, render_groups, render_insight_candidates, render_messages,
                                    render_numbered_messages)
from nemori_dspy.types import Episode, ScoredEpisode, ScoredSemantic, SearchResult, SemanticEntry, StoredMessage

TS = datetime(2023, 5, 8, 13, 0)


def _words(text: str) -> int:
    return len(text.split())


def _result(k=3, m=6) -> SearchResult:
    eps = []
    for i in range(k):
        msg = StoredMessage(user_id="u", id=f"m{i}", seq=i, speaker="A", content=f"raw {i} " * 5, timestamp=TS)
        eps.append(ScoredEpisode(score=1 - i / 10, episode=Episode(
            id=f"e{i}", user_id="u", cue=f"cue{i}", narrative=f"narr{i}", message_ids=[f"m{i}"], messages=[msg],
            start=TS, end=TS, vector=[1.0])))
    facts = [ScoredSemantic(score=1 - j / 10, entry=SemanticEntry(id=f"s{j}", user_id="u", text=f"fact{j}",
                                                                   vector=[1.0])) for j in range(m)]
    return SearchResult(episodes=eps, semantic=facts)


def test_fit_context_admits_every_narrative_first_then_raw_and_facts_by_rank_in_the_papers_section_order():
    result = _result()
    headers = sum(_words(h) + 1 for h in CONTEXT_HEADERS)
    # narratives 0-2 (4 words+1 each), raw 0 (13 words+1), facts 0-1 (2 words+1 each): fits exactly
    kept, raw_ids = fit_context(result, 2, headers + 15 + 14 + 3 + 3, count=_words)
    assert [s.episode.id for s in kept.episodes] == ["e0", "e1", "e2"] and raw_ids == {"e0"}
    assert [s.entry.id for s in kept.semantic] == ["s0", "s1"]
    text = render_context(kept, 2, raw_ids=raw_ids)
    assert text.index(CONTEXT_HEADERS[0]) < text.index(CONTEXT_HEADERS[1]) < text.index(CONTEXT_HEADERS[2])
    assert _words(text) <= headers + 35


def test_fit_context_never_drops_a_retrieved_episode_for_a_better_ones_raw_messages():
    result = _result()
    headers = sum(_words(h) + 1 for h in CONTEXT_HEADERS)
    kept, raw_ids = fit_context(result, 2, headers + 5 + 14 + 5, count=_words)  # rank order would keep e0 + raw 0
    assert [s.episode.id for s in kept.episodes] == ["e0", "e1", "e2"] and raw_ids == set()


def test_fit_context_skips_an_item_that_does_not_fit_and_takes_smaller_later_ones():
    result = _result(k=2, m=2)
    headers = sum(_words(h) + 1 for h in CONTEXT_HEADERS)
    kept, raw_ids = fit_context(result, 2, headers + 5 + 3 + 5, count=_words)  # no room for raw (14)
    assert [s.episode.id for s in kept.episodes] == ["e0", "e1"] and raw_ids == set()
    assert [s.entry.id for s in kept.semantic] == ["s0"]


def test_fit_context_with_room_for_everything_keeps_everything():
    result = _result()
    kept, raw_ids = fit_context(result, 2, 10_000, count=_words)
    assert kept == result and raw_ids == {"e0", "e1"}
    assert render_context(kept, 2, raw_ids=raw_ids) == render_context(result, 2)


def test_batched_inputs_number_groups_and_insights_from_one():
    m = StoredMessage(user_id="u", id="m", seq=1, speaker="A", content="hi", timestamp=TS)
    assert render_groups([[m], [m, m]]) == ("Group 1:\n[2023-05-08 13:00] A: hi\nGroup 2:\n"
                                            "[2023-05-08 13:00] A: hi\n[2023-05-08 13:00] A: hi")
    assert render_insight_candidates([("x", ["a", "b"]), ("y", ["c"])]) == (
        "Insight 1: x\n  [1] a\n  [2] b\nInsight 2: y\n  [1] c")


def test_messages_share_the_budget_but_are_never_clipped_below_the_floor():
    assert per_message_chars(10, 4000, 12000) == 1200
    assert per_message_chars(100, 4000, 12000) == MIN_MESSAGE_CHARS  # 120 each would fit; the floor wins
    assert per_message_chars(3, 4000, None) == 4000


def test_a_crowded_prompt_keeps_the_floor_of_every_message():
    msgs = [StoredMessage(id=f"m{i}", user_id="u", seq=i + 1, speaker="Ann", content="x" * 1000,
                          timestamp=datetime(2023, 5, 7, 13, i)) for i in range(40)]
    lines = render_messages(msgs, max_chars=4000, budget=2000).splitlines()
    assert len(lines) == 40 and all(line.count("x") == MIN_MESSAGE_CHARS for line in lines)


def _session(times: list[tuple[int, int]]) -> list[StoredMessage]:
    return [StoredMessage(user_id="u", id=f"m{i}", seq=i, speaker="AB"[i % 2], content=f"text {i}",
                          timestamp=datetime(2023, 5, 8, h, mi)) for i, (h, mi) in enumerate(times)]


def test_per_message_timestamps_are_the_papers_layout():
    msgs = _session([(13, 0), (13, 0)])
    assert render_messages(msgs) == "[2023-05-08 13:00] A: text 0\n[2023-05-08 13:00] B: text 1"
    assert render_numbered_messages(msgs).splitlines()[1] == "2. [2023-05-08 13:00] B: text 1"


def test_on_change_timestamps_date_a_run_of_messages_once_and_again_where_the_time_changes():
    msgs = _session([(13, 0), (13, 0), (13, 0), (18, 30)])
    assert render_messages(msgs, timestamps="on_change").splitlines() == [
        "[2023-05-08 13:00]", "A: text 0", "B: text 1", "A: text 2", "[2023-05-08 18:30]", "B: text 3"]
    assert render_numbered_messages(msgs, timestamps="on_change").splitlines()[1:4] == [
        "1. A: text 0", "2. B: text 1", "3. A: text 2"]
    groups = render_groups([msgs[:2], msgs[2:]], timestamps="on_change").splitlines()
    assert groups == ["Group 1:", "[2023-05-08 13:00]", "A: text 0", "B: text 1",
                      "Group 2:", "[2023-05-08 13:00]", "A: text 2", "[2023-05-08 18:30]", "B: text 3"]


def test_on_change_timestamps_are_shorter_and_keep_every_message():
    msgs = _session([(13, 0)] * 20)
    paper, compact = render_messages(msgs), render_messages(msgs, timestamps="on_change")
    assert len(compact) < 0.6 * len(paper)
    assert all(f"text {i}" in compact for i in range(20))


def test_an_unknown_timestamp_layout_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="per_message, on_change"):
        render_messages(_session([(13, 0)]), timestamps="never")


def test_entry_texts_reads_back_what_render_entries_wrote():
    from nemori_dspy.formatting import entry_texts, render_entries

    texts = ["(2024-03-01) Priya lives in Leeds.", "Tom [cycles] to work."]
    assert entry_texts(render_entries(texts)) == texts
    assert entry_texts(render_entries([])) == []
