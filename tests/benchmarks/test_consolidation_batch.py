"""Per-insight vs batched P_con on the labelled cases: the scoring, and a scripted run end to end."""

from __future__ import annotations

import json

from benchmarks.consolidation_batch import figures, main, score_case


def test_a_decision_is_right_only_with_the_right_action_and_exactly_the_right_targets():
    case = {"action": "conflict", "targets": [2]}
    assert score_case(case, {"action": "conflict", "targets": [2]}) == (1.0, True)
    assert score_case(case, {"action": "conflict", "targets": ["2", 1]}) == (0.75, False)
    assert score_case(case, {"action": "new", "targets": []}) == (0.0, False)
    assert score_case({"action": "new", "targets": []}, {"action": "NEW", "targets": [1]}) == (1.0, True)


def test_figures_pair_the_two_modes_per_kind_and_count_fallbacks():
    def row(kind, a, b, fallback=False):
        return {"kind": kind, "per_insight": {"score": a, "right": a == 1.0},
                "batched": {"score": b, "right": b == 1.0}, "fallback": fallback}

    fig = figures({"cases": [row("update", 1.0, 0.0), row("update", 0.0, 1.0, True), row("different_person", 1.0, 1.0)]})
    assert fig["all"]["n"] == 3 and fig["update"]["n"] == 2 and fig["fallbacks"] == 1
    assert fig["update"]["right"]["wins"] == 1 and fig["update"]["right"]["losses"] == 1
    assert fig["different_person"]["score"]["diff"] == 0.0


def test_runs_both_modes_with_the_scripted_lm_and_writes_the_result(tmp_path, capsys):
    assert main(["--lm", "scripted", "--max-cases", "8", "--batch", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "per_insight: 8 LLM calls" in out and "batched: 2 LLM calls" in out
    (path,) = tmp_path.glob("consolidation_batch-scripted-*.json")
    data = json.loads(path.read_text())
    assert data["figures"]["all"]["n"] == 8 and len(data["figures"]["cases"]) == 8 and data["machine"]["cores"]


def test_against_pairs_one_mode_with_an_earlier_result_of_the_same_cases(tmp_path, capsys):
    assert main(["--lm", "scripted", "--max-cases", "6", "--out", str(tmp_path)]) == 0
    (first,) = tmp_path.glob("*.json")
    assert main(["--lm", "scripted", "--max-cases", "6", "--modes", "per_insight", "--against", str(first),
                 "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "right before" in out and "right per_insight" in out and "batched:" not in out.split("wrote")[-2]


def test_against_refuses_a_file_of_other_cases(tmp_path):
    import pytest

    from nemori_dspy.errors import ConfigError

    assert main(["--lm", "scripted", "--max-cases", "6", "--out", str(tmp_path)]) == 0
    (first,) = tmp_path.glob("*.json")
    with pytest.raises(ConfigError, match="other cases"):
        main(["--lm", "scripted", "--max-cases", "5", "--modes", "per_insight", "--against", str(first)])
