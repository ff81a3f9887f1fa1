"""``eval.summary``: the run summary's JSON form is the file's, older files load, bad ones name the fix."""

from __future__ import annotations

import json

import pytest

from nemori_dspy.errors import DatasetError
from nemori_dspy.eval.summary import Coverage, RunResult, RunSummary, load_summary

#: a LoCoMo summary.json as the eval writes it (every section, in the file's order)
CURRENT = {
    "scores": {"nemori": {"judge.overall": 1.0, "f1.overall": 0.25, "n.overall": 3}},
    "usage": {"answer": {"calls": 3, "cache_hits": 0, "failures": 0, "input_tokens": 90, "output_tokens": 9,
                         "seconds": 0.5, "cost_usd": 0.0}},
    "construction_usage": {},
    "embedding_usage": {"calls": 2, "texts": 7, "tokens": 0, "seconds": 0.01, "cost_usd": 0.0},
    "counters": {"insights": 2}, "coverage": {"c1": {"messages": 4, "in_one_episode": 4, "in_no_episode": 0,
                                                      "in_several": 0, "episodes": 1}},
    "parked": [], "reused_memory": ["c1"], "ingest_seconds": 0.0, "answer_seconds": 1.5, "concurrency": 4,
    "resumed_answers": 0, "systems": ["nemori"],
    "questions": 3, "judge": {"model": "m", "prompt_hash": "abc", "failures": 0},
    "judges": {"judge": {"model": "m", "prompt_hash": "abc", "failures": 0}}, "judge_metrics": ["judge"],
    "judge_audit": {"judge": {"on_gold": 1.0, "on_wrong": None, "overall": 1.0, "n_gold": 2, "n_wrong": 0, "n": 2}},
    "paired": None, "stage_activity": {"turns": 4, "episodes": 1, "stages": {}, "guards": []}, "memory": None,
}


def test_summary_json_round_trips_unchanged(tmp_path):
    RunSummary.model_validate(CURRENT).write(tmp_path / "summary.json")
    text = (tmp_path / "summary.json").read_text()
    assert text == json.dumps(CURRENT, indent=2)  # same keys, order, ints and floats
    lme = {**CURRENT, "longmemeval": {"nemori": {}}, "benchmark": "LongMemEval"}
    assert RunSummary.model_validate(lme).to_json() == lme


def test_an_older_file_without_the_later_sections_loads(tmp_path):
    old = {k: CURRENT[k] for k in ("scores", "usage", "counters", "coverage", "parked", "reused_memory",
                                   "ingest_seconds", "resumed_answers", "judge")}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    s = load_summary(tmp_path / "summary.json")
    assert s.coverage["c1"] == Coverage(messages=4, in_one_episode=4, in_no_episode=0, in_several=0, episodes=1)
    assert s.systems == [] and s.judge_audit is None and s.stage_activity is None and s.judge.prompt_hash == "abc"
    assert s.scores["nemori"]["n.overall"] == 3 and isinstance(s.scores["nemori"]["n.overall"], int)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"coverage": {"c1": {"messages": "many"}}})])
def test_a_bad_file_names_itself_and_the_fix(tmp_path, text):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(DatasetError, match=r"summary\.json is not an eval run summary.*re-run the eval"):
        load_summary(tmp_path / "summary.json")


def test_the_result_carries_what_is_printed_but_not_saved():
    result = RunResult.model_validate({**CURRENT, "table": "t", "usage_table": "u", "rows": [{"system": "nemori"}]})
    assert result.summary().to_json() == CURRENT and "table" not in result.to_json()
