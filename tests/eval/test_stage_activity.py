"""Stage activity: calls per stage per 100 turns and per episode, and every guard counter with its stage and why."""

from __future__ import annotations

import dspy

from eval.stage_activity import STAGES, guard_stage, stage_activity, stage_activity_table, stage_metrics
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Usage
from tests.fakes import ScriptedLM, default_responders, messages


def test_rates_per_100_turns_and_per_episode_and_zero_stages_shown():
    usage = {"narrate": Usage(calls=3, cache_hits=1), "distill": {"calls": 2, "cache_hits": 0},
             "answer": Usage(calls=9)}
    a = stage_activity(usage, {"evoke_empty": 2, "insights_dropped.fragment": 1, "unheard_of": 0}, turns=40, episodes=4)
    assert a["stages"]["narrate"] == {"calls": 4, "per_100_turns": 10.0, "per_episode": 1.0}
    assert a["stages"]["select"] == {"calls": 0, "per_100_turns": 0.0, "per_episode": 0.0}  # never ran: shown
    assert list(a["stages"]) == list(STAGES) and "answer" not in a["stages"]
    assert [(g["stage"], g["counter"], g["count"], g["per_100_turns"]) for g in a["guards"]] == [
        ("anticipate", "evoke_empty", 2, 5.0), ("distill", "insights_dropped.fragment", 1, 2.5)]


def test_no_turns_or_episodes_give_no_rates():
    a = stage_activity({"narrate": Usage(calls=1)}, {"evoke_empty": 1}, turns=0, episodes=0)
    assert a["stages"]["narrate"]["per_100_turns"] is None and a["guards"][0]["per_episode"] is None
    assert "-" in stage_activity_table(activity=a)


def test_every_counter_gets_a_stage_and_a_why_association_and_unknown_ones_too():
    assert guard_stage("association.no_candidate_in_gap")[0] == "select"
    assert guard_stage("association.something_new") == ("select", "association guard: something_new")
    assert guard_stage("insights_dropped.new_reason") == ("distill", "insight dropped: new_reason")
    assert guard_stage("retries.narrate") == ("narrate", "re-asked after a failed call")
    assert guard_stage("consolidation.candidates_below_floor")[0] == "consolidate"
    assert guard_stage("mystery") == ("other", "mystery")
    # the new user's run showed these bare: each has its stage and a why
    for counter, stage in [("consolidation.other_person", "consolidate"), ("narrate_chunks", "narrate"),
                           ("distill_chunks", "distill"), ("judge_known_wrong.restates_question", "answer")]:
        assert guard_stage(counter)[0] == stage and guard_stage(counter)[1] != counter


def test_answer_side_counters_have_no_per_turn_rates():
    a = stage_activity({}, {"answer_context_items_dropped": 184, "evoke_empty": 1}, turns=58, episodes=3)
    rows = {g["counter"]: g for g in a["guards"]}
    assert rows["answer_context_items_dropped"]["per_100_turns"] is None
    assert rows["answer_context_items_dropped"]["count"] == 184 and rows["evoke_empty"]["per_100_turns"] == 1.72


def test_the_table_lists_stages_then_guards_with_why():
    text = stage_activity_table({"partition": Usage(calls=2)}, {"partition_skipped_short": 3,
                                                               "association.below_similarity": 1}, 100, 10)
    assert text.startswith("100 turns, 10 episodes")
    lines = text.splitlines()
    assert any(line.split()[:4] == ["partition", "2", "2.00", "0.20"] for line in lines)
    guard = next(line for line in lines if "partition_skipped_short" in line)
    assert "partition_min_messages" in guard and "3.00" in guard
    assert lines.index(guard) < next(i for i, line in enumerate(lines) if "association.below_similarity" in line)
    assert "guards: none fired" in stage_activity_table({}, {}, 10, 1)


def test_mlflow_metrics_are_named_per_stage_and_guard():
    m = stage_metrics(stage_activity({"narrate": Usage(calls=5)}, {"evoke_empty": 1}, 50, 5))
    assert m["stage.narrate.calls_per_100_turns"] == 10.0 and m["stage.narrate.calls_per_episode"] == 1.0
    assert m["stage.select.calls_per_100_turns"] == 0.0 and m["guard.evoke_empty.per_100_turns"] == 2.0


def test_a_scripted_build_shows_what_ran_and_what_was_skipped(tmp_path):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20))
        mem.add_messages("u", messages(20))
        mem.flush("u")
    usage = mem.usage.snapshot()
    a = stage_activity(usage, mem.usage.counters, turns=20, episodes=len(mem.list_episodes("u")))
    assert a["stages"]["narrate"]["calls"] == lm.calls["NarrateEpisode"] and a["stages"]["narrate"]["per_episode"] == 1
    # every episode either ran P_ant or was skipped by the no-known-facts guard (the first one, at least)
    skipped = next(g for g in a["guards"] if g["counter"] == "anticipate_skipped_no_facts")
    assert skipped["stage"] == "anticipate" and skipped["count"] >= 1
    assert a["stages"]["anticipate"]["calls"] + skipped["count"] == a["episodes"]
