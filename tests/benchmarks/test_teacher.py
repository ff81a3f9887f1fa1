"""The teacher table (``benchmarks.teacher``) end to end on the scripted LM: rows on the same held-out sessions,
paired against the 0.5B row, the share of the gap closed, and the result file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import teacher
from nemori_dspy.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "synthetic_locomo.json"


def test_rows_score_the_same_sessions_and_pair_against_the_small_model(tmp_path, capsys):
    program = tmp_path / "program.json"
    program.write_text("{}")  # an empty saved state: the default prompts
    assert teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--program", str(program),
                         "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("teacher-narrate-*.json")
    fig = json.loads(path.read_text())["figures"]
    rows = {r["row"]: r for r in fig["rows"]}
    assert list(rows) == ["0.5b", "0.5b-tuned", "1.5b"] and len({r["n"] for r in rows.values()}) == 1
    assert rows["0.5b"]["paired_vs_0.5b"] is None and rows["1.5b"]["paired_vs_0.5b"]["n"] == rows["0.5b"]["n"]
    assert all(r["usage"]["narrate"]["calls"] == r["n"] for r in rows.values())  # cache off: every call is real
    assert "narrate metric" in out and "wrote" in out


def test_the_tuned_row_needs_a_program_and_unknown_rows_fail_before_any_model(tmp_path):
    with pytest.raises(ConfigError, match="unknown row 'big'.*Fix"):
        teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--rows", "0.5b,big"])
    with pytest.raises(ConfigError, match="needs the tuned program"):
        teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--rows", "0.5b-tuned",
                      "--out", str(tmp_path)])


def test_gap_closed_is_the_tuned_rows_share_of_the_difference():
    rows = [{"row": "0.5b", "mean": 0.2, "scores": [0.2]}, {"row": "0.5b-tuned", "mean": 0.3, "scores": [0.3]},
            {"row": "1.5b", "mean": 0.6, "scores": [0.6]}]
    assert teacher.figures(rows)["gap_closed"] == pytest.approx(0.25)


def _optimize_result(path: Path, before: list[float], after: list[float]) -> Path:
    def score(xs: list[float]) -> dict:
        return {"mean": sum(xs) / len(xs), "low": min(xs), "high": max(xs), "n": len(xs), "scores": xs}

    path.write_text(json.dumps([{"stage": "narrate", "test_before": score(before), "test_after": score(after),
                                 "cost": {"narrate": {"calls": 7}}, "seconds": 60}]))
    return path


def test_the_small_rows_can_come_from_the_optimize_runs_test_scores_on_the_same_sessions(tmp_path, capsys):
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions
    from nemori_dspy.optimizers.datasets import narrate_session_examples

    convs = [slice_sessions(c, parse_sessions("1-2")) for c in load_locomo(DATA, ["conv-c"])]
    n = len(narrate_session_examples(convs, NemoriSettings(_env_file=None)))
    result = _optimize_result(tmp_path / "result.json", [0.1] * n, [0.2] * n)
    assert teacher.main(["--data", str(DATA), "--test", "conv-c", "--sessions", "1-2", "--lm", "scripted",
                         "--optimize-result", str(result), "--reuse-optimize-test", "--out", str(tmp_path)]) == 0
    fig = json.loads(next(tmp_path.glob("teacher-narrate-*.json")).read_text())["figures"]
    rows = {r["row"]: r for r in fig["rows"]}
    assert list(rows) == ["0.5b", "0.5b-tuned", "1.5b"] and {r["n"] for r in rows.values()} == {n}
    assert rows["0.5b-tuned"]["scores"] == [0.2] * n and rows["0.5b"]["from"].endswith("(test_before)")
    assert rows["1.5b"]["usage"]["narrate"]["calls"] == n  # only the 1.5b row ran
    assert rows["0.5b-tuned"]["paired_vs_0.5b"]["diff"] == pytest.approx(0.1)
    assert "optimize run's test" in capsys.readouterr().out


def test_reused_rows_must_be_the_same_examples(tmp_path):
    result = _optimize_result(tmp_path / "result.json", [0.1] * 99, [0.2] * 99)
    with pytest.raises(ConfigError, match="scored 99 test examples.*Fix"):
        teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--optimize-result", str(result),
                      "--reuse-optimize-test", "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match="--reuse-optimize-test reads"):
        teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--reuse-optimize-test"])


def test_zero_shot_rows_drop_the_seed_demo_and_pair_against_the_shipped_model(tmp_path, capsys):
    assert teacher.row_settings("1.5b-zero-shot", "local")["seed_demos"] is False
    assert "seed_demos" not in teacher.row_settings("1.5b", "local")
    assert teacher.main(["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--rows", "1.5b,1.5b-zero-shot",
                         "--out", str(tmp_path)]) == 0
    fig = json.loads(next(tmp_path.glob("teacher-narrate-*.json")).read_text())["figures"]
    rows = {r["row"]: r for r in fig["rows"]}
    assert rows["1.5b-zero-shot"]["paired_vs_1.5b"]["n"] == rows["1.5b"]["n"] and rows["1.5b"]["paired_vs_1.5b"] is None
    assert "− 1.5b, paired" in capsys.readouterr().out


def test_against_pairs_each_row_with_the_same_row_of_an_earlier_file(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    args = ["--data", str(DATA), "--test", "conv-c", "--lm", "scripted", "--rows", "1.5b"]
    assert teacher.main([*args, "--out", str(first)]) == 0
    (earlier,) = first.glob("teacher-narrate-*.json")
    assert teacher.main([*args, "--against", str(earlier), "--out", str(second)]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads(next(second.glob("teacher-narrate-*.json")).read_text())["figures"]["rows"]
    assert row["paired_vs_earlier"]["n"] == row["n"] and row["paired_vs_earlier"]["diff"] == 0.0
    assert "1.5b vs the same row of the --against file" in out


def test_an_earlier_file_with_other_examples_is_not_paired():
    rows = [{"row": "1.5b", "scores": [0.5, 0.5], "mean": 0.5}]
    fig = teacher.figures(rows, None, earlier=[{"row": "1.5b", "scores": [0.1], "mean": 0.1}])
    assert fig["rows"][0]["paired_vs_earlier"] is None
