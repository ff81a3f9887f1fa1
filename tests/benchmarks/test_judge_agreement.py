import json

import pytest

from benchmarks.judge_agreement import agreement, main
from nemori_dspy.errors import ConfigError


def _result(judge_a, judge_b):
    rows = [{"system": s, "sample_id": "c", "index": i, "judge": float(v)}
            for s, scores in (("no-memory", judge_a), ("nemori", judge_b)) for i, v in enumerate(scores)]
    return {"figures": {"per_question": rows}}


def _labels(hand_a, hand_b):
    return [{"sample_id": "c", "index": i, "system": s, "hand": v}
            for s, hand in (("no-memory", hand_a), ("nemori", hand_b)) for i, v in enumerate(hand)]


def test_a_lenient_judge_shows_as_low_precision_and_hides_a_paired_difference():
    # the judge calls every no-memory answer right; by hand nemori wins 3 questions
    fig = agreement(_result([1, 1, 1, 1], [1, 1, 1, 1]), _labels([0, 0, 0, 1], [1, 1, 1, 1]))
    assert fig["per_system"]["no-memory"]["precision"] == 0.25 and fig["per_system"]["nemori"]["agreement"] == 1.0
    assert fig["overall"]["agreement"] == 5 / 8 and fig["overall"]["recall"] == 1.0
    assert fig["paired"]["hand"]["diff"] == 0.75 and fig["paired"]["hand"]["wins"] == 3
    assert fig["paired"]["judge"]["diff"] == 0.0


def test_a_label_without_its_row_is_refused_naming_it():
    with pytest.raises(ConfigError, match="'c', 9, 'nemori'"):
        agreement(_result([1], [1]), [{"sample_id": "c", "index": 9, "system": "nemori", "hand": 1}])


def test_cli_prints_the_table_and_writes_the_figures(tmp_path, capsys):
    (tmp_path / "r.json").write_text(json.dumps(_result([0, 1], [1, 1])))
    (tmp_path / "l.json").write_text(json.dumps({"result": "r.json", "labels": _labels([0, 1], [1, 1])}))
    assert main(["--labels", str(tmp_path / "l.json"), "--result", str(tmp_path / "r.json"), "--out",
                 str(tmp_path)]) == 0
    assert "| no-memory | 2 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "judge_agreement-l.json").read_text())["figures"]["overall"]["n"] == 4
