"""Episodic integration: partition validation/repair, narration, the merge path."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.modules.episodic import association_candidates, repair_partition
from nemori_dspy.types import Episode, ScoredEpisode
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, chat_reply, default_responders


def _is_partition(groups, n):
    flat = [i for g in groups for i in g]
    return sorted(flat) == list(range(1, n + 1))


@pytest.mark.parametrize("reply, problem", [
    ([[1, 2, 3, 4], [6, 7, 8, 9, 10], list(range(11, 21))], "missing 5"),
    ([[1, 2, 3], [3, 4, 5], list(range(6, 21))], "duplicate 3"),
    ([list(range(1, 11)), list(range(11, 22))], "out of range 21"),
    ([[0, 1, 2], ["x", 3], list(range(4, 21))], "out of range 0"),
    ("not a list", "not a list"),
    ([], "missing 1"),
])
def test_repair_partition_always_returns_a_true_partition(reply, problem):
    groups, problems = repair_partition(reply, 20)
    assert _is_partition(groups, 20)
    assert any(problem in p for p in problems)
    assert all(g == sorted(g) for g in groups)


def test_repair_partition_keeps_a_valid_reply_unchanged():
    groups, problems = repair_partition([[1, 2], [3], [4, 5]], 5)
    assert groups == [[1, 2], [3], [4, 5]] and problems == []


def test_missing_index_joins_its_predecessors_group():
    groups, _ = repair_partition([[1, 2, 3, 4], [6, 7]], 7)
    assert groups == [[1, 2, 3, 4, 5], [6, 7]]


def _messages(n, start=datetime(2023, 5, 8, 13, 0), prefix="D1"):
    return [{"speaker": "Caroline" if i % 2 else "Melanie", "content": f"talk {i} about topic {i // 5}",
             "timestamp": start + timedelta(minutes=i), "id": f"{prefix}:{i}"} for i in range(1, n + 1)]


@pytest.mark.parametrize("bad_groups", [
    [[1, 2, 3, 4], [6, 7, 8, 9, 10], list(range(11, 21))],   # omits 5
    [[1, 2, 3], [3, 4, 5], list(range(6, 21))],              # lists 3 twice
    [list(range(1, 11)), list(range(11, 22))],               # includes 21
])
def test_bad_partition_reply_through_chat_adapter_loses_no_message(tmp_path, bad_groups):
    responders = default_responders()
    responders["PartitionMessages"] = lambda i: chat_reply(groups=bad_groups)
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20))
        mem.add_messages("u", _messages(20))
        seen = [mid for ep in mem.list_episodes("u") for mid in ep.message_ids]
    assert sorted(seen) == sorted(f"D1:{i}" for i in range(1, 21))
    assert len(seen) == len(set(seen)) == 20


def test_narration_prompt_carries_message_dates_not_today(tmp_path):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20))
        mem.add_messages("u", [{"speaker": "Caroline", "content": "I went to Paris last week!",
                                "timestamp": "2023-05-24T10:00:00"}])
        mem.flush("u")
    narrate_inputs = [inp for name, inp in lm.prompts if name == "NarrateEpisode"]
    assert narrate_inputs and "2023-05-24" in narrate_inputs[0]["messages"]
    assert datetime.now().strftime("%Y-%m-%d") not in narrate_inputs[0]["messages"]
    # the relative date is resolved for the model, so even a 0.5B narrator can copy it
    assert "in the week of 17 May 2023 (last week)" in narrate_inputs[0]["messages"]


def test_relative_date_resolution_can_be_turned_off(tmp_path):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        settings = NemoriSettings(window_size=20, resolve_relative_dates=False)
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        mem.add_messages("u", [{"speaker": "Caroline", "content": "I went to Paris last week!",
                                "timestamp": "2023-05-24T10:00:00"}])
        mem.flush("u")
    narrated = [inp["messages"] for name, inp in lm.prompts if name == "NarrateEpisode"]
    assert narrated and "I went to Paris last week!" in narrated[0] and "May 2023" not in narrated[0]


def test_merge_path_supersedes_the_earlier_episode(tmp_path):
    responders = default_responders(groups_of=10)
    responders["SelectContinuation"] = lambda i: chat_reply(choice=1)
    responders["IntegrateEpisodes"] = lambda i: chat_reply(cue="Pottery, continued", narrative="Both parts merged.")
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        store = SQLiteStore(tmp_path / "m.db")
        mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=10))
        mem.add_messages("u", _messages(10))
        first = mem.list_episodes("u")
        assert len(first) == 1
        mem.add_messages("u", _messages(10, start=datetime(2023, 5, 8, 14, 0), prefix="D2"))
        eps = mem.list_episodes("u")
    assert len(eps) == 1
    merged = eps[0]
    assert merged.narrative == "Both parts merged."
    assert first[0].id in merged.supersedes
    assert len(merged.message_ids) == 20 and len(merged.messages) == 20
    assert store.stats("u")["superseded_episodes"] == 1
    # the merged episode is distilled whole: its raw messages reach the distiller
    distilled = [inp["episode_messages"] for name, inp in lm.prompts if name == "DistillPredictionError"]
    # (in runs of at most distill_chunk_messages: 20 messages → 7, 7, 6)
    merged_runs = "\n".join(distilled[-3:])
    assert "13:01" in merged_runs and "14:10" in merged_runs


def test_association_only_sees_earlier_windows(tmp_path):
    """Two groups of one window are never merged with each other (that would undo the partition)."""
    responders = default_responders(groups_of=5)
    responders["SelectContinuation"] = lambda i: chat_reply(choice=1)
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
        mem.add_messages("u", _messages(10))
    assert len(mem.list_episodes("u")) == 2
    assert lm.calls.get("SelectContinuation", 0) == 0


def test_narration_failing_permanently_stores_no_episode_and_keeps_messages_pending(tmp_path):
    responders = default_responders()

    def down(_inputs):
        raise ConnectionError("model server down")

    responders["NarrateEpisode"] = down
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        store = SQLiteStore(tmp_path / "m.db")
        mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=10))
        res = mem.add_messages("u", _messages(10))
        assert res.report.parked and "stay buffered" in res.report.parked[0]
        assert store.stats("u")["episodes"] == 0 and mem.status("u").pending == 10
        st = mem.status("u")
        assert not st.healthy and "model server down" in st.parked[0]
    # after a restart the parked reason is gone but the waiting work is still reported (from the store)
    reopened = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
    assert reopened.status("u").pending == 10 and reopened.status("u").parked == []
    # the model comes back: the same messages are processed, none lost
    with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()):
        assert not mem.flush("u").parked
    assert mem.status("u").healthy and mem.status("u").parked == []
    assert sorted(m for ep in mem.list_episodes("u") for m in ep.message_ids) == sorted(f"D1:{i}" for i in range(1, 11))


def _two_sessions(tmp_path, **settings):
    """Two 10-message sessions a month apart, P_sel always choosing candidate 1: (memory, scripted LM)."""
    responders = default_responders(groups_of=10)
    responders["SelectContinuation"] = lambda i: chat_reply(choice=1)
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10, **settings))
        mem.add_messages("u", _messages(10))
        mem.add_messages("u", _messages(10, start=datetime(2023, 6, 9, 14, 0), prefix="D2"))  # a month later
    return mem, lm


def test_episodes_far_apart_in_time_are_not_merge_candidates_under_the_gap_guard(tmp_path, ledger):
    mem, lm = _two_sessions(tmp_path, association_max_gap_hours=24)
    assert len(mem.list_episodes("u")) == 2 and "SelectContinuation" not in lm.calls
    assert ledger.counters["association.candidates"] == 1 and ledger.counters["association.no_candidate_in_gap"] == 1


def test_by_default_an_earlier_session_is_a_candidate_and_p_sel_decides(tmp_path, ledger):
    """No time guard by default (LoCoMo's sessions are >= 28 h apart): an earlier session a month before reaches
    P_sel (the similarity floor is off here: hashing vectors are not MiniLM's)."""
    mem, lm = _two_sessions(tmp_path, association_min_similarity=None)
    assert lm.calls["SelectContinuation"] == 1 and len(mem.list_episodes("u")) == 1
    assert ledger.counters["association.candidates"] == 1 and "association.below_similarity" not in ledger.counters


def test_candidates_below_the_similarity_floor_never_reach_p_sel(tmp_path, ledger):
    mem, lm = _two_sessions(tmp_path, association_min_similarity=0.999)
    assert "SelectContinuation" not in lm.calls and len(mem.list_episodes("u")) == 2
    assert ledger.counters["association.below_similarity"] == 1


def _ep(eid, vector, hour=10):
    t = datetime(2023, 5, 8, hour)
    return Episode(id=eid, user_id="u", cue=eid, narrative=eid, message_ids=[eid], start=t, end=t, vector=vector)


def test_association_candidates_keep_those_at_or_above_the_floor_best_first_and_use_merged_versions():
    new = _ep("new", [1.0, 0.0])
    a, b, c = _ep("a", [0.6, 0.8]), _ep("b", [0.8, 0.6]), _ep("c", [0.0, 1.0])
    merged_a = _ep("a2", [0.9, 0.436])  # ``a`` merged earlier in this window: its new vector counts
    hits = [ScoredEpisode(episode=b, score=0.8), ScoredEpisode(episode=a, score=0.6), ScoredEpisode(episode=c, score=0.0)]
    s = NemoriSettings(association_min_similarity=0.6)
    assert [e.id for e in association_candidates(new, hits, {}, s)] == ["b", "a"]  # 0.6 is at the floor: kept
    assert [e.id for e in association_candidates(new, hits, {"a": merged_a}, s)] == ["a2", "b"]
    paper = NemoriSettings(association_min_similarity=None)
    assert [e.id for e in association_candidates(new, hits, {}, paper)] == ["b", "a", "c"]


def test_a_window_spanning_two_conversations_is_cut_at_the_time_gap(tmp_path):
    responders = default_responders()
    responders["PartitionMessages"] = lambda i: chat_reply(groups=[list(range(1, int(i["message_count"]) + 1))])
    lm = ScriptedLM(responders)
    msgs = _messages(6) + _messages(4, start=datetime(2023, 5, 25, 9, 0), prefix="D2")  # 17 days later
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64),
                     NemoriSettings(window_size=10, hold_open_segment=False))  # the paper's fixed windows
        mem.add_messages("u", msgs)
    spans = sorted((ep.start.date().isoformat(), len(ep.message_ids)) for ep in mem.list_episodes("u"))
    assert spans == [("2023-05-08", 6), ("2023-05-25", 4)]
    assert all(int(inp["message_count"]) in (6, 4) for name, inp in lm.prompts if name == "PartitionMessages")


def test_the_conversation_after_a_windows_last_gap_waits_for_the_next_window_and_is_never_cut(tmp_path):
    responders = default_responders()
    responders["PartitionMessages"] = lambda i: chat_reply(groups=[list(range(1, int(i["message_count"]) + 1))])
    lm = ScriptedLM(responders)
    later = _messages(12, start=datetime(2023, 5, 25, 9, 0), prefix="D2")  # 17 days later, 12 turns
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
        report = mem.add_messages("u", _messages(6) + later[:4]).report
        assert [len(ep.message_ids) for ep in mem.list_episodes("u")] == [6]  # D2:1-4 may go on: held
        assert mem.status("u").pending == 4 and not report.parked
        mem.add_messages("u", later[4:10])  # D2 is 10 turns, a full window without a gap: formed whole
        assert mem.status("u").pending == 0
        mem.add_messages("u", later[10:])
        mem.flush("u")  # a flush forms what is held
    spans = sorted((ep.start.date().isoformat(), len(ep.message_ids)) for ep in mem.list_episodes("u"))
    assert spans == [("2023-05-08", 6), ("2023-05-25", 2), ("2023-05-25", 10)]
    assert mem.usage.counters["segments_held"] == 1


# --- naive and offset-carrying timestamps of one user in one window

MIXED = [  # (id, timestamp as sent); with naive = UTC the moments are 14:00, 15:30, 16:00 and 01:00 (+1 day)
    ("m1", "2023-05-24T14:00:00"), ("m2", "2023-05-24T23:30:00+08:00"),
    ("m3", "2023-05-24T16:00:00"), ("m4", "2023-05-25T09:00:00+08:00"),
]


def _mixed(tmp_path, **settings):
    responders = default_responders()
    responders["PartitionMessages"] = lambda i: chat_reply(groups=[list(range(1, int(i["message_count"]) + 1))])
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20, **settings))
        mem.add_messages("u", [{"speaker": "Caroline", "content": f"message {mid}", "timestamp": ts, "id": mid}
                               for mid, ts in MIXED])
        report = mem.flush("u")
    return mem, report, lm


def test_mixed_naive_and_offset_timestamps_flush_and_split_by_real_elapsed_time(tmp_path):
    mem, report, lm = _mixed(tmp_path)
    assert not report.parked and mem.status("u").pending == 0
    eps = mem.list_episodes("u")
    # m3 → m4 is 9 h of real time (> 6 h): cut there; m1..m3 are 2 h apart in all
    assert [ep.message_ids for ep in eps] == [["m1", "m2", "m3"], ["m4"]]
    first = eps[0]
    assert first.start == datetime(2023, 5, 24, 14, 0) and first.end == datetime(2023, 5, 24, 16, 0)
    # prompts keep each message's own clock time
    narrated = [inp["messages"] for name, inp in lm.prompts if name == "NarrateEpisode"][0]
    assert "[2023-05-24 23:30]\nCaroline: message m2" in narrated and "[2023-05-24 14:00]" in narrated


def test_naive_timestamps_are_read_in_the_configured_zone(tmp_path):
    # naive read in Shanghai time: m1 = 06:00 UTC, m2 = 15:30, m3 = 08:00, m4 = 01:00 (+1 day)
    mem, report, _ = _mixed(tmp_path, naive_timezone="Asia/Shanghai")
    assert not report.parked
    assert sorted(ep.message_ids for ep in mem.list_episodes("u")) == [["m1"], ["m2", "m3"], ["m4"]]


def test_an_unknown_naive_timezone_is_a_settings_error():
    with pytest.raises(ValueError, match="naive_timezone"):
        NemoriSettings(naive_timezone="Mars/Olympus")


def test_an_episode_narrated_without_a_cue_is_labelled_by_its_narrative_start(tmp_path):
    from nemori_dspy.modules.episodic import CUE_FALLBACK_CHARS

    narrative = "Melanie and Caroline talked about topics zero and one, then planned a camping trip " * 3
    responders = default_responders()
    responders["PartitionMessages"] = lambda i: chat_reply(groups=[list(range(1, 11))])
    responders["NarrateEpisode"] = lambda i: chat_reply(cue="", narrative=narrative)
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
        mem.add_messages("u", _messages(10))
    (ep,) = mem.list_episodes("u")
    assert ep.cue == narrative.strip()[:CUE_FALLBACK_CHARS] and len(ep.cue) == CUE_FALLBACK_CHARS < len(ep.narrative)


# --- cost switches of episodic integration (docs/configuration.md "Cost switches")
def _run(tmp_path, responders, n=20, **settings):
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20, **settings))
        mem.add_messages("u", _messages(n))
        mem.flush("u")
        return lm, mem.list_episodes("u")


def test_batched_narration_makes_one_call_per_window_with_the_same_episodes(tmp_path):
    lm_paper, paper = _run(tmp_path / "a", default_responders(), narration_mode="per_group")
    lm, batched = _run(tmp_path / "b", default_responders(), narration_mode="batched")
    assert lm_paper.calls["NarrateEpisode"] == 4 and "NarrateEpisodes" not in lm_paper.calls
    assert lm.calls["NarrateEpisodes"] == 1 and "NarrateEpisode" not in lm.calls
    assert [(e.id, e.cue, e.narrative) for e in batched] == [(e.id, e.cue, e.narrative) for e in paper]


@pytest.mark.parametrize("reply", [
    lambda i: "not the format",                                                          # does not parse
    lambda i: chat_reply(episodes=[{"group": 1, "cue": "c", "narrative": "n"}]),         # too few episodes
    lambda i: chat_reply(episodes=[{"group": g, "cue": "c", "narrative": "n"} for g in (1, 1, 2, 3)]),  # bad numbers
    lambda i: chat_reply(episodes=[{"group": g, "cue": "c", "narrative": ""} for g in (1, 2, 3, 4)]),   # empty
])
def test_unusable_batched_narration_falls_back_to_one_call_per_group(tmp_path, reply):
    responders = default_responders()
    responders["NarrateEpisodes"] = reply
    lm, eps = _run(tmp_path, responders, narration_mode="batched")
    assert lm.calls["NarrateEpisode"] == 4 and len(eps) == 4
    assert all(e.narrative != "n" for e in eps)


def test_every_narration_runs_before_association(tmp_path):
    """Calls of one stage run back to back, so the server reuses their shared instruction prefix."""
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20))
        mem.add_messages("u", _messages(20))
        mem.add_messages("u", _messages(20, start=datetime(2023, 5, 8, 14, 0), prefix="D2"))
    order = [name for name, _ in lm.prompts if name in ("NarrateEpisode", "SelectContinuation")]
    window2 = order[4:]  # window 1: 4 narrations and no select (nothing earlier to continue)
    assert window2[:4] == ["NarrateEpisode"] * 4 and set(window2[4:]) == {"SelectContinuation"}


@pytest.mark.parametrize("n, min_messages, partition_calls", [(2, 3, 0), (2, 2, 1), (3, 3, 1), (1, 2, 0)])
def test_segments_shorter_than_partition_min_messages_skip_p_par(tmp_path, n, min_messages, partition_calls):
    lm, eps = _run(tmp_path, default_responders(), n=n, partition_min_messages=min_messages)
    assert lm.calls.get("PartitionMessages", 0) == partition_calls
    assert sorted(m for e in eps for m in e.message_ids) == sorted(f"D1:{i}" for i in range(1, n + 1))


def test_select_on_cues_sends_no_candidate_narratives(tmp_path):
    lm = ScriptedLM(default_responders(groups_of=20))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64),
                     NemoriSettings(window_size=20, select_inputs="cues"))
        mem.add_messages("u", _messages(20))
        mem.add_messages("u", _messages(20, start=datetime(2023, 5, 8, 14, 0), prefix="D2"))
    first = mem.list_episodes("u")[0]
    sent = [i for name, i in lm.prompts if name == "SelectContinuation"][0]
    assert first.cue in sent["candidates"] and first.narrative not in sent["candidates"]
    assert sent["candidates"].startswith("[1] (2023-05-08) ")


@pytest.mark.parametrize("chars,shown", [(None, 400), (160, 160)])
def test_p_par_sees_messages_cut_to_partition_message_chars_and_p_nar_whole(tmp_path, chars, shown):
    lm = ScriptedLM(default_responders())
    long = "x" * 400
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64),
                     NemoriSettings(window_size=4, partition_message_chars=chars))
        mem.add_messages("u", [{"speaker": "Caroline", "content": long, "timestamp": f"2023-05-24T10:0{i}:00"}
                               for i in range(4)])
    partition = [inp for name, inp in lm.prompts if name == "PartitionMessages"][0]["messages"]
    assert partition.startswith("[2023-05-24 10:00]\n1. Caroline: x")  # one stamp per time, on its own line
    assert all(line.count("x") == shown for line in partition.splitlines() if not line.startswith("["))
    assert all(inp["messages"].count(long) >= 1 for name, inp in lm.prompts if name == "NarrateEpisode")


def test_a_narrative_that_copies_a_message_line_is_asked_again_with_every_message_dated(tmp_path):
    responders = default_responders()
    copy_or_tell = lambda i: chat_reply(  # noqa: E731 - copies the last line unless every line carries its stamp
        cue="Paris", narrative=i["messages"].splitlines()[-1] if not i["messages"].startswith("[2023-05-24 10:00] ")
        else "Jon told Gina about his trip to Paris in May 2023.")
    responders["NarrateEpisode"] = copy_or_tell
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        mem.add_messages("u", [{"speaker": "Jon", "content": "I went to Paris.", "timestamp": "2023-05-24T10:00:00"},
                               {"speaker": "Gina", "content": "Wow!", "timestamp": "2023-05-24T10:01:00"}])
        mem.flush("u")
    assert [ep.narrative for ep in mem.list_episodes("u")] == ["Jon told Gina about his trip to Paris in May 2023."]
    assert lm.calls["NarrateEpisode"] == 2 and mem.usage.counters["narrate_copied_line"] == 1


# --- no junk in a narrative (issue 19): an echo is asked again once, then replaced by the quoted messages
from nemori_dspy.modules.episodic import fallback_cue, fallback_narrative  # noqa: E402
from nemori_dspy.types import StoredMessage  # noqa: E402

#: what the 0.5B model wrote as a narrative: P_nar's instruction (its narrative clause) word for word
ECHO = ("A faithful third-person account of what happened and what was said, naming the speakers, keeping concrete "
        "details (names, places, numbers, feelings, plans). Do not invent facts.")
TRIP = [{"speaker": "Jon", "content": "Hey Gina! Good to see you!", "timestamp": "2023-05-24T10:00:00"},
        {"speaker": "Jon", "content": "I went to Paris last week with my sister.", "timestamp": "2023-05-24T10:01:00"},
        {"speaker": "Gina", "content": "Wow!", "timestamp": "2023-05-24T10:02:00"}]


def _narrated(tmp_path, narrate, **settings):
    responders = default_responders()
    responders["NarrateEpisode"] = narrate
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(**settings))
        mem.add_messages("u", TRIP)
        mem.flush("u")
    return lm, mem


@pytest.mark.parametrize("layout", ["on_change", "per_message"])
def test_an_echoed_narrative_is_asked_again_once_in_the_other_layout(tmp_path, layout):
    first = {}

    def narrate(i):
        first.setdefault("layout", i["messages"][:20])
        if i["messages"][:20] == first["layout"]:
            return chat_reply(cue="Jon tells Gina about Paris", narrative=ECHO)
        return chat_reply(cue="Jon tells Gina about Paris", narrative="Jon told Gina about his trip to Paris.")

    lm, mem = _narrated(tmp_path, narrate, message_timestamps=layout)
    assert [ep.narrative for ep in mem.list_episodes("u")] == ["Jon told Gina about his trip to Paris."]
    assert lm.calls["NarrateEpisode"] == 2 and mem.usage.counters["narrate_junk_retry"] == 1
    assert "narrate_fallback" not in mem.usage.counters


def test_an_echo_twice_stores_the_messages_quoted_attributed_and_dated(tmp_path):
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue="(none)", narrative=ECHO))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == ("On 24 May 2023 Jon and Gina talked. "  # the greeting and "Wow!" are left out
                            "Jon said: \u201cI went to Paris last week with my sister.\u201d")
    assert ep.cue == "Jon and Gina talked on 24 May 2023" and ECHO not in ep.narrative
    assert lm.calls["NarrateEpisode"] == 2
    assert {k: mem.usage.counters[k] for k in ("narrate_junk_retry", "narrate_fallback", "narrate_fallback_cue")} == {
        "narrate_junk_retry": 1, "narrate_fallback": 1, "narrate_fallback_cue": 1}


def test_a_copied_line_after_its_re_ask_is_replaced_too(tmp_path):
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue="Paris", narrative="Jon: I went to Paris last week."))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative.startswith("On 24 May 2023 Jon and Gina talked.") and ep.cue == "Paris"
    assert mem.usage.counters["narrate_copied_line"] == 1 and mem.usage.counters["narrate_fallback"] == 1


#: the seed demo restated with this episode's speakers (what the 1.5B writer did to conv-30's first session)
DEMO_ECHO = ("On 14 March 2022 Gina told Jon that she had adopted a rescue greyhound named Biscuit on 12 March 2022. "
             "She said Biscuit sleeps most of the day but is scared of the stairs.")
DEMO_CUE = "Gina tells Jon about adopting her rescue greyhound Biscuit (14 March 2022)"


def test_a_narrative_that_only_restates_the_seed_demo_is_asked_again_then_quoted_not_left_unbuilt(tmp_path):
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue=DEMO_CUE, narrative=DEMO_ECHO))
    (ep,) = mem.list_episodes("u")  # the session is built: no parked window, no message left out
    assert ep.narrative.startswith("On 24 May 2023 Jon and Gina talked.") and "Biscuit" not in ep.narrative
    assert ep.cue == "Jon and Gina talked on 24 May 2023"
    assert lm.calls["NarrateEpisode"] == 2
    assert {k: mem.usage.counters[k] for k in ("narrate_demo_echo_retry", "narrate_fallback")} == {
        "narrate_demo_echo_retry": 1, "narrate_fallback": 1}


def test_a_demo_echo_answered_by_a_narrative_on_the_re_ask_keeps_that_narrative(tmp_path):
    replies = iter([chat_reply(cue=DEMO_CUE, narrative=DEMO_ECHO),
                    chat_reply(cue=DEMO_CUE, narrative="Jon told Gina about his trip to Paris with his sister.")])
    lm, mem = _narrated(tmp_path, lambda i: next(replies))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == "Jon told Gina about his trip to Paris with his sister."
    assert ep.cue == "Jon and Gina talked on 24 May 2023"  # the demo's cue is never stored
    assert mem.usage.counters["narrate_demo_echo_cue"] == 1 and "narrate_fallback" not in mem.usage.counters


def test_an_echo_of_a_tuned_demo_is_dropped_from_the_stored_narrative(tmp_path):
    """A program's bootstrapped demos are checked as the seed demos are (a loaded or optimized P_nar shows them)."""
    responders = default_responders()
    tuned = "Melanie encourages her to continue her education and explore career options."
    responders["NarrateEpisode"] = lambda i: chat_reply(cue="Paris",
                                                        narrative=f"Jon went to Paris with his sister. {tuned}")
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        mem.pipeline.episodic.narrate.predict.demos = [
            dspy.Example(messages="Caroline: Gonna continue my edu!", cue="Caroline's plans", narrative=tuned)]
        mem.add_messages("u", TRIP)
        mem.flush("u")
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == "Jon went to Paris with his sister."
    assert mem.usage.counters["narrate_demo_echo_dropped"] == 1


def test_a_junk_episode_of_a_batched_reply_is_narrated_on_its_own(tmp_path):
    responders = default_responders()
    batched = responders["NarrateEpisodes"]

    def echo_first(i):  # the batched narrator echoes the description for group 1
        return batched(i).replace('"narrative": "', f'"narrative": "{ECHO}", "x": "', 1)

    responders["NarrateEpisodes"] = echo_first
    lm, eps = _run(tmp_path, responders, narration_mode="batched")
    assert lm.calls["NarrateEpisodes"] == 1 and lm.calls["NarrateEpisode"] == 1 and len(eps) == 4
    assert all(ECHO not in e.narrative for e in eps)


def test_the_fallback_narrative_dates_each_day_and_stays_within_its_cap():
    t = datetime(2023, 5, 8, 13, 0)
    msgs = [StoredMessage(user_id="u", id=f"m{i}", seq=i, speaker="Caroline" if i % 2 else "Melanie",
                          content=f"I painted picture number {i} of the lake at dawn. " * 3,
                          timestamp=t + timedelta(days=i // 3)) for i in range(12)]
    text = fallback_narrative(msgs, max_chars=900)
    assert text.startswith("On 8 May 2023 Melanie and Caroline talked. Melanie said: \u201cI painted picture number 0")
    assert "On 9 May 2023 Caroline said" in text and text.endswith("more messages)") and len(text) <= 900 + 20
    one = fallback_narrative(msgs[:1])
    assert one.startswith("On 8 May 2023 Melanie said: \u201c")
    assert fallback_cue(msgs[:1]) == "Melanie wrote on 8 May 2023"


def test_a_looping_narrative_keeps_each_sentence_once_and_drops_the_cut_tail(tmp_path):
    loop = ("Jon told Gina about his trip to Paris. Gina asked about the food. Jon said it was great. "
            "Gina asked about the food. Jon said it was great. Gina asked about")
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue="Jon tells Gina about Paris", narrative=loop))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == "Jon told Gina about his trip to Paris. Gina asked about the food. Jon said it was great."
    assert mem.usage.counters["narrate_repeats_dropped"] == 3 and lm.calls["NarrateEpisode"] == 1


def test_a_narrative_sentence_crediting_the_wrong_speaker_gets_the_speaker_who_said_it(tmp_path):
    """Jon went to Paris ("I went to Paris last week with my sister"); a narrative saying Gina did is put right,
    and the stage-activity counter says so."""
    narrative = "Jon greeted Gina. Gina went to Paris last week with her sister. Gina was amazed."
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue="Jon's trip to Paris", narrative=narrative))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == "Jon greeted Gina. Jon went to Paris last week with her sister. Gina was amazed."
    assert mem.usage.counters["narrate_reattributed"] == 1


def test_a_narrative_restating_itself_or_copying_a_first_person_line_is_stored_third_person(tmp_path):
    """A restated sentence is dropped (``narrate_restatements_dropped``) and a copied first-person line becomes
    Jon's attributed quote (``narrate_first_person_quoted``): what is stored says who said what, once."""
    narrative = ("Jon told Gina that he went to Paris with his sister. Jon also told Gina he went to Paris with "
                 "his sister. I went to Paris last week with my sister.")
    lm, mem = _narrated(tmp_path, lambda i: chat_reply(cue="Jon's trip to Paris", narrative=narrative))
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == ("Jon told Gina that he went to Paris with his sister. "
                            "Jon said: \u201cI went to Paris last week with my sister.\u201d")
    assert mem.usage.counters["narrate_restatements_dropped"] == 1
    assert mem.usage.counters["narrate_first_person_quoted"] == 1


def test_an_image_mark_copied_into_a_narrative_is_told_as_its_sharers_picture(tmp_path):
    """The chat's ``[shares an image: …]`` mark glued into the prose becomes a sentence naming whose picture it is
    (``narrate_captions_attributed``), as in the main job's session-2 narrative at MEMORY_FORMAT 22."""
    msgs = TRIP[:2] + [{"speaker": "Gina", "content": "Wow! [shares an image: a cat on a sofa]",
                        "timestamp": "2023-05-24T10:02:00"}]
    narrative = "Jon told Gina about his trip to Paris. [shares an image: a cat on a sofa] Gina was amazed."
    responders = default_responders()
    responders["NarrateEpisode"] = lambda i: chat_reply(cue="Jon's trip to Paris", narrative=narrative)
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        mem.add_messages("u", msgs)
        mem.flush("u")
    (ep,) = mem.list_episodes("u")
    assert ep.narrative == ("Jon told Gina about his trip to Paris. Gina shared an image: a cat on a sofa. "
                            "Gina was amazed.")
    assert mem.usage.counters["narrate_captions_attributed"] == 1


# --- narrate_chunk_messages: P_nar on runs of an episode's messages
def _one_episode_narrated(tmp_path, n, **settings):
    """``n`` messages P_par keeps as one episode; P_nar answers each call with the numbers of the messages it saw."""
    responders = default_responders(groups_of=100)

    def narrate(i):
        talks = re.findall(r"talk (\d+)", i["messages"])
        return chat_reply(cue=f"Caroline and Melanie on talks {talks[0]}-{talks[-1]}",
                          narrative=f"Caroline and Melanie discussed talks {talks[0]} to {talks[-1]}.")

    responders["NarrateEpisode"] = narrate
    return _run(tmp_path, responders, n=n, **settings)


def test_a_long_episode_is_narrated_run_by_run_and_the_narratives_joined_in_order(tmp_path, ledger):
    lm, eps = _one_episode_narrated(tmp_path, 20, narrate_chunk_messages=8)
    assert lm.calls["NarrateEpisode"] == 3 and len(eps) == 1            # 20 messages → runs of 7, 6, 7
    ep = eps[0]
    assert ep.narrative == ("Caroline and Melanie discussed talks 1 to 7. Caroline and Melanie discussed talks 8 to 13. "
                            "Caroline and Melanie discussed talks 14 to 20.")
    assert ep.cue == ("Caroline and Melanie on talks 1-7; Caroline and Melanie on talks 8-13; "
                      "Caroline and Melanie on talks 14-20")
    assert len(ep.message_ids) == 20 and ledger.counters["narrate_chunks"] == 3


@pytest.mark.parametrize("n, chunk, calls", [(8, 8, 1), (20, None, 1), (9, 8, 2)])
def test_an_episode_within_the_run_length_or_with_runs_off_is_narrated_in_one_call(tmp_path, n, chunk, calls):
    """None is the paper's one P_nar call per episode (§3.2.2)."""
    lm, eps = _one_episode_narrated(tmp_path, n, narrate_chunk_messages=chunk)
    assert lm.calls["NarrateEpisode"] == calls and len(eps) == 1
    assert eps[0].narrative.count("discussed") == calls
