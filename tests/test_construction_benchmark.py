"""benchmarks/construction.py runs at toy size with the scripted LM, so it cannot rot (figures are not asserted
against targets: this only checks it measures what it says)."""

from __future__ import annotations

import json

from benchmarks.construction import CONFIGS, answer_coverage, main, run, table
from tests.fakes import SYNTHETIC_LOCOMO


def test_every_configuration_runs_and_the_switches_cut_calls_without_losing_recall():
    results, label = run(SYNTHETIC_LOCOMO, "1-2", None, "scripted", list(CONFIGS), progress=False)
    by = {r.name: r for r in results}
    assert label == "scripted" and [r.name for r in results] == list(CONFIGS)
    paper, batched = by["paper"], by["narrate-batched"]
    assert paper.per_stage["narrate"]["calls"] > 0 and "narrate" not in batched.per_stage
    assert batched.calls_per_100 < paper.calls_per_100 and batched.recall_at_k == paper.recall_at_k
    assert by["context-2000"].per_stage == paper.per_stage  # reuses the paper memories: no second build
    assert all(r.parked == 0 and r.questions > 0 for r in results)
    assert "| paper |" in table(results)


def test_main_writes_the_result_file_with_the_machine(tmp_path, capsys):
    assert main(["--data", str(SYNTHETIC_LOCOMO), "--sessions", "1-1", "--configs", "paper,all",
                 "--out", str(tmp_path)]) == 0
    out = json.loads(next(tmp_path.glob("construction-scripted-*.json")).read_text())
    assert [r["name"] for r in out["results"]] == ["paper", "all"]
    assert out["machine"]["cores"] and out["targets"]["calls_per_100"] == 35
    assert "calls / 100 turns (≤ 35)" in capsys.readouterr().out


def test_answer_coverage_counts_gold_words_found():
    assert answer_coverage("7 May 2023", {"7", "may", "2023"}) == 1.0
    assert answer_coverage("the dog Rex", {"rex"}) == 0.5
    assert answer_coverage("the", {"x"}) is None


def test_a_switch_falling_back_shows_in_its_counters(monkeypatch):
    import nemori_dspy.testing as testing
    from nemori_dspy.testing import default_responders

    def broken_batch():
        responders = default_responders()
        responders["NarrateEpisodes"] = lambda i: "not the format"
        return responders

    monkeypatch.setattr(testing, "default_responders", broken_batch)  # benchmarks.lm_runtime reads it at use
    results, _ = run(SYNTHETIC_LOCOMO, "1-2", None, "scripted", ["paper", "narrate-batched"], progress=False)
    paper, batched = results
    assert "narrate_batch_fallback" not in paper.counters and batched.counters["narrate_batch_fallback"] > 0
    assert batched.per_stage["narrate"]["calls"] == paper.per_stage["narrate"]["calls"]


def test_answer_mode_scores_each_configuration_side_by_side_with_cis(tmp_path, capsys):
    assert main(["--data", str(SYNTHETIC_LOCOMO), "--sessions", "1-2", "--configs", "paper,default", "--answer",
                 "--max-questions", "2", "--out", str(tmp_path)]) == 0
    out = json.loads(next(tmp_path.glob("construction-scripted-*.json")).read_text())
    paper, default = out["results"]
    assert paper["answered"] == default["answered"] > 0 and out["answer"] is True
    assert set(paper["scores"]) == {"judge", "f1", "recall_at_10"}  # the scripted LM also judges
    assert all(len(v) == 3 and v[1] <= v[0] <= v[2] for v in paper["scores"].values())
    printed = capsys.readouterr().out
    assert "| configuration | answered | judge | f1 | recall_at_10 | means inside paper's CIs |" in printed
    assert "judge yes" in printed or "judge no" in printed


def test_spaced_takes_evenly_spread_items():
    from benchmarks.construction import spaced, within

    assert spaced(list(range(10)), 3) == [0, 4, 9] and spaced([1, 2], 5) == [1, 2] and spaced([1, 2], None) == [1, 2]
    assert within([50.0, 40.0, 60.0], [55.0, 45.0, 65.0]) and not within([30.0, 20.0, 40.0], [55.0, 45.0, 65.0])


def test_answer_mode_pairs_each_configuration_with_the_first_on_the_same_questions(tmp_path, capsys):
    assert main(["--data", str(SYNTHETIC_LOCOMO), "--sessions", "1-2", "--configs", "paper,narrate-batched",
                 "--answer", "--max-questions", "4", "--out", str(tmp_path)]) == 0
    out = json.loads(next(tmp_path.glob("construction-scripted-*.json")).read_text())
    paper, batched = out["results"]
    assert paper["paired"] == {} and set(batched["paired"]) == {"judge", "f1", "recall_at_10"}
    judge = batched["paired"]["judge"]
    assert judge["n"] == paper["answered"] == batched["answered"]  # every question answered by both
    assert {"wins", "losses", "mcnemar_p"} <= set(judge) and "mcnemar_p" not in batched["paired"]["f1"]
    assert judge["low"] <= judge["diff"] <= judge["high"]
    # the answered questions are a stratified sample: every category of the slice is represented
    cats = {q["category"] for q in paper["per_question"]}
    assert len(cats) == len({q["category"] for q in batched["per_question"]}) and len(cats) > 1
    printed = capsys.readouterr().out
    assert "| configuration B | vs A | metric | n | A | B | B − A [95% CI] | B wins / A wins | McNemar p |" in printed
    assert "| narrate-batched | paper | judge |" in printed
