"""benchmarks.distill_replay on a stage-record file written here for the synthetic mini conversation (scripted
LM, hashing embedder: no model, no network)."""

from __future__ import annotations

import json

import pytest

from benchmarks import distill_replay as dr
from nemori_dspy.errors import ConfigError
from tests.fakes import SYNTHETIC_MINI

MESSAGES = ("[2023-04-03 10:15]\n"
            "Noor: Morning, Elias! I finally went to my first pottery class on Saturday.\n"
            "Elias: Nice! How did it go? I've been meaning to ask since you mentioned signing up.\n"
            "Noor: Messy but wonderful. I made four lopsided bowls and one of them actually holds water.")
GOLD = "Noor made four lopsided bowls in her first pottery class, and one of them holds water."


def _stages(tmp_path, insights):
    path = tmp_path / "m.stages.jsonl"
    rows = [{"stage": "narrate", "inputs": {"messages": MESSAGES}, "outputs": {"cue": "c", "narrative": "n"},
             "meta": {"user_id": "synth-1"}},
            {"stage": "distill", "inputs": {"episode_messages": MESSAGES, "predicted_episode": "Noor talks to Elias."},
             "outputs": {"insights": insights}, "meta": {"user_id": "synth-1", "message_ids": ["D1:1", "D1:2", "D1:3"]}}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_recorded_p_dis_calls_are_read_in_order_and_other_stages_skipped(tmp_path):
    runs = list(dr.recorded_runs([_stages(tmp_path, [GOLD])]))
    assert [(r["row"], r["user"], r["ids"], r["recorded"]) for r in runs] == [
        (1, "synth-1", ["D1:1", "D1:2", "D1:3"], [GOLD])]


def test_a_file_without_p_dis_calls_or_missing_is_refused_with_the_fix(tmp_path):
    empty = tmp_path / "e.stages.jsonl"
    empty.write_text(json.dumps({"stage": "narrate", "inputs": {}, "outputs": {}, "meta": {}}) + "\n")
    with pytest.raises(ConfigError, match="no P_dis call"):
        list(dr.recorded_runs([empty]))
    with pytest.raises(ConfigError, match="not found"):
        list(dr.recorded_runs([tmp_path / "nope.jsonl"]))


def test_replay_scores_both_replies_on_the_runs_gold_observations(tmp_path, capsys):
    out = tmp_path / "results"
    figures = dr.main(["--data", str(SYNTHETIC_MINI), "--stages", str(_stages(tmp_path, [GOLD])), "--lm", "scripted",
                       "--embedder", "hashing", "--out", str(out)])
    assert figures["runs"] == 1 and figures["gold"] >= 2  # the observations of D1:1-D1:3
    recall = figures["recall"]
    assert recall["n"] == figures["gold"] and recall["mean_a"] > 0  # the recorded reply states a gold observation
    assert figures["kept_recorded"] == 1 and figures["kept_replayed"] >= 1  # the scripted reply's quotes
    printed = capsys.readouterr().out
    assert "| P_dis calls | gold obs." in printed and "result:" in printed
    saved = json.loads(next(out.glob("distill_replay-scripted-*.json")).read_text())
    assert saved["figures"]["runs_detail"][0]["recorded"] == [GOLD]
