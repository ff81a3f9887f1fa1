"""benchmarks/ablation.py end to end with the scripted LM on the synthetic fixture (no model, no network): the
Table 5 run, its paired differences against nemori, cost per construction and the result file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import ablation
from benchmarks.ablation import GroupRun, construction_groups, default_systems, figures, main, resolve_slice
from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.systems import SYSTEMS, parse_systems
from nemori_dspy.eval.summary import RunResult
from tests.fakes import SYNTHETIC_LOCOMO

SMALL = "nemori,nemori-s,nemori-no-episodic,nemori-no-raw,no-memory"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One scripted ablation over sessions 1-2, 3 questions per conversation, fresh memory (cost measured)."""
    tmp = tmp_path_factory.mktemp("ablation")
    assert main(["--data", str(SYNTHETIC_LOCOMO), "--lm", "scripted", "--sessions", "1-2", "--max-questions", "3",
                 "--systems", SMALL, "--run-dir", str(tmp / "run"), "--fresh-memory", "--out", str(tmp / "out")]) == 0
    path = next((tmp / "out").glob("ablation-scripted-1-2-*.json"))
    return json.loads(path.read_text()), tmp


def test_every_system_is_scored_on_the_same_questions_and_paired_with_nemori(result):
    out, _ = result
    fig, params = out["figures"], out["params"]
    assert params["complete"] and params["systems"] == SMALL.split(",") and out["machine"]["cores"]
    assert fig["baseline"] == "nemori" and fig["systems"][0] == "no-memory"  # Table 5 order
    ns = {s: p["scores"]["f1"]["overall"][3] for s, p in fig["per_system"].items()}
    assert len(set(ns.values())) == 1 and ns["nemori"] > 0
    vs = fig["paired"]["vs"]
    assert set(vs) == set(SMALL.split(",")) - {"nemori"}
    assert vs["no-memory"]["judge"]["n"] == ns["nemori"] and "mcnemar_p" in vs["no-memory"]["judge"]
    assert vs["no-memory"]["f1"]["diff"] < 0  # the scripted answerer knows nothing without memory
    assert len(fig["per_question"]) == len(SMALL.split(",")) * ns["nemori"]


def test_each_construction_is_charged_its_own_cost_per_100_turns(result):
    out, _ = result
    per = out["figures"]["per_system"]
    nemori, direct = per["nemori"]["construction"], per["nemori-s"]["construction"]
    assert not nemori["reused"] and nemori["calls_per_100"] > 0 and nemori["turns"] == out["params"]["turns"]
    assert "distill" in nemori["per_stage"] and "direct_distill" not in nemori["per_stage"]
    assert "direct_distill" in direct["per_stage"] and "distill" not in direct["per_stage"]
    assert per["nemori-no-episodic"]["construction"] == nemori  # same memory, read differently
    assert per["no-memory"]["construction"] is None


def test_the_report_has_the_table5_layout_and_the_distillation_finding(result, capsys):
    out, tmp = result
    text = out["figures"]["report"]
    assert "| configuration | system | mgmt | n | judge | F1 | BLEU-1 | recall@10 | judge − nemori |" in text
    assert "| w/o e | nemori-no-episodic | ✓ |" in text and "| Nemori-s | nemori-s | ✓ |" in text
    assert "## Paired differences vs nemori" in text
    assert "prediction error vs direct distillation (w/o e − Nemori-s), judge:" in text
    findings = out["figures"]["findings"]
    assert set(findings) == {"w/o e − Nemori-s", "nemori − nemori-s"} and "mcnemar_p" in findings["nemori − nemori-s"]["judge"]
    # the eval's own run folders: one per construction, each with its paired table when it ran two systems
    tables = (tmp / "run" / "1-nemori" / "tables.md").read_text()
    assert "## Paired differences vs nemori" in tables
    summary = json.loads((tmp / "run" / "1-nemori" / "summary.json").read_text())
    assert summary["paired"]["baseline"] == "nemori" and "no-memory" in summary["paired"]["vs"]


def test_a_second_run_reuses_the_built_memory_and_says_its_cost_is_not_measured(result, tmp_path):
    out, tmp = result
    groups = ablation.run(SYNTHETIC_LOCOMO, None, "1-2", "scripted", parse_systems("nemori"), tmp_path / "again",
                          max_questions=1, base={"cache": False, "cache_dir": str(tmp / "run" / "memory-cache")},
                          progress=False)
    fig = figures(groups, out["params"]["turns"], n_resamples=100)
    assert fig["per_system"]["nemori"]["construction"]["reused"] is True
    assert "| Nemori (default) | nemori | ✓ |" in ablation.report(fig) and "reused" in ablation.report(fig)


def test_memory_and_stage_activity_sections_are_carried_when_the_summary_has_them(tmp_path):
    rows = [{"system": s, "sample_id": "c", "index": i, "category": 1, "judge": float(i % 2), "f1": 0.5}
            for s in ("nemori", "no-memory") for i in range(4)]
    summary = RunResult(rows=rows, construction_usage={"narrate": {"calls": 2, "input_tokens": 90, "output_tokens": 10}},
                        memory={"caption": "shares ×100", "table": "system  fact recall\nnemori  50.0"},
                        stage_activity={"anticipate": {"calls_per_100": 3.0}})
    fig = figures([GroupRun(["nemori", "no-memory"], tmp_path, summary)], turns=200, n_resamples=200)
    nemori = fig["per_system"]["nemori"]
    assert nemori["memory"]["table"].endswith("50.0") and nemori["stage_activity"]["anticipate"]["calls_per_100"] == 3.0
    assert nemori["construction"]["per_stage"] == {"narrate": {"calls": 1.0, "tokens": 50.0}}
    assert fig["per_system"]["no-memory"]["memory"] is None
    text = ablation.report(fig)
    assert "## Memory quality, memory of nemori" in text and "shares ×100\nsystem  fact recall\nnemori  50.0" in text
    assert "## Stage activity, memory of nemori" in text and '"calls_per_100": 3.0' in text  # unknown layout: JSON
    assert "needs nemori-s" in text


def test_systems_group_by_the_memory_they_read():
    groups = construction_groups(parse_systems("no-memory,nemori,nemori-s,nemori-no-raw,full-context"))
    assert [[s.name for s in g] for g in groups] == [["nemori", "nemori-no-raw", "no-memory", "full-context"],
                                                      ["nemori-s"]]
    assert [s.name for s in construction_groups(parse_systems("no-memory"))[0]] == ["no-memory"]


def test_default_systems_are_the_table5_ones_that_exist():
    names = default_systems()
    assert names[0] == "nemori" and all(n in SYSTEMS for n in names)
    assert set(names) == set(ablation.DEFAULT_SYSTEMS) & set(SYSTEMS)


def test_named_slices_resolve_as_eval_locomo_resolves_them_and_unknown_ones_fail_with_a_fix(monkeypatch):
    from nemori_dspy.eval import locomo

    assert resolve_slice("memory") == (["conv-49"], None)  # the real named slice of `eval locomo --slice`
    monkeypatch.setitem(locomo.NAMED_SLICES, "tiny", (("synth-1",), locomo.SessionSlice(first=1, last=2), "test"))
    assert resolve_slice("tiny") == (["synth-1"], "1-2")
    with pytest.raises(ConfigError, match="unknown slice.*Fix: use one of memory"):
        resolve_slice("nope")


def test_an_unknown_system_fails_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="unknown system"):
        main(["--data", str(SYNTHETIC_LOCOMO), "--lm", "scripted", "--systems", "nemori,bogus",
              "--run-dir", str(tmp_path / "r"), "--out", str(tmp_path)])
    assert not list(Path(tmp_path).glob("ablation-*.json"))


def _split(out: dict, tmp: Path, groups: list[list[str]]) -> list[Path]:
    """The one result file cut into one file per group of systems, as separate group-at-a-time runs write them."""
    paths = []
    for i, names in enumerate(groups):
        fig = {"per_system": {n: out["figures"]["per_system"][n] for n in names},
               "per_question": [r for r in out["figures"]["per_question"] if r["system"] in names]}
        path = tmp / f"part{i}.json"
        path.write_text(json.dumps({"params": {**out["params"], "systems": names}, "figures": fig}))
        paths.append(path)
    return paths


def test_group_at_a_time_runs_merge_into_the_same_pairing_as_one_run(result, tmp_path, capsys):
    out, _ = result
    parts = _split(out, tmp_path, [["nemori", "no-memory", "nemori-no-episodic"], ["nemori-s", "nemori-no-raw"]])
    assert main(["--merge", *map(str, parts), "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads(next((tmp_path / "merged").glob("ablation-scripted-*-merged.json")).read_text())
    fig = merged["figures"]
    assert merged["params"]["merged_from"] == ["part0.json", "part1.json"]
    assert fig["paired"]["vs"]["nemori-s"] == out["figures"]["paired"]["vs"]["nemori-s"]  # paired across files
    assert fig["findings"] == out["figures"]["findings"]
    assert "| Nemori-s | nemori-s | ✓ |" in capsys.readouterr().out


def test_merging_runs_of_different_data_or_the_same_system_twice_fails_naming_why(result, tmp_path):
    out, _ = result
    a, b = _split(out, tmp_path, [["nemori", "no-memory"], ["nemori-s"]])
    other = json.loads(b.read_text())
    other["params"]["judge_model"] = "another-judge"
    b.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="params.judge_model"):
        ablation.merge_results([a, b])
    with pytest.raises(ConfigError, match="'nemori' is in more than one file"):
        ablation.merge_results([a, a])
    with pytest.raises(ConfigError, match="two or more"):
        ablation.merge_results([a])
