"""``eval.report``: a fake eval run (+ one child run) logged to a temporary sqlite MLflow store."""

from __future__ import annotations

import time

import pytest

from nemori_dspy.errors import ConfigError

from nemori_dspy.eval.report import parse_metrics, report


def test_parse_metrics_shapes():
    scores, cost = parse_metrics({"nemori.judge.overall": 0.5, "nemori.n.overall": 10, "n.temporal": 4,
                                  "f1.temporal": 0.25, "cost.narrate.calls": 3, "counter.repairs": 1,
                                  "ingest_seconds": 9.0, "nemori.judge.bogus": 1.0}, "run")
    assert scores == {"nemori": {("judge", "overall"): 0.5, ("n", "overall"): 10},
                      "run": {("n", "temporal"): 4, ("f1", "temporal"): 0.25}}
    assert cost == {"narrate": {"calls": 3}}


def _log(client, exp_id, name, metrics, parent=None):
    from mlflow.entities import Metric

    tags = {"mlflow.parentRunId": parent} if parent else {}
    now = int(time.time() * 1000) + 1000 * len(client.search_runs([exp_id]))  # strictly later start times
    run = client.create_run(exp_id, run_name=name, tags=tags, start_time=now)
    client.log_batch(run.info.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.fixture
def tracked(tmp_path, mlflow_db):
    from mlflow.tracking import MlflowClient

    uri = mlflow_db
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("nemori-dspy", artifact_location=str(tmp_path / "artifacts"))
    old = _log(client, exp_id, "older", {"nemori.judge.overall": 0.1})
    parent = _log(client, exp_id, "locomo-full", {
        "nemori.judge.overall": 0.75, "nemori.judge.temporal": 0.5, "nemori.f1.overall": 0.4321,
        "nemori.n.overall": 20, "nemori.n.temporal": 4,
        "no-memory.judge.overall": 0.05, "no-memory.f1.temporal": 0.125, "no-memory.n.overall": 20,
        "cost.narrate.calls": 6, "cost.narrate.input_tokens": 300, "cost.narrate.output_tokens": 100,
        "cost.narrate.seconds": 2.5, "cost.narrate.cost_usd": 0.0,
        "cost.answer.calls": 2, "cost.answer.input_tokens": 100, "cost.answer.output_tokens": 0,
        "counter.repairs": 1, "ingest_seconds": 12.0, "n.single-hop": 7, "nemori.judge.single-hop": 1.0})
    _log(client, exp_id, "rag-child", {"judge.overall": 0.6, "n.overall": 20, "nemori.judge.overall": 0.7},
         parent=parent)
    # a per-system child repeating the parent's scores (as eval locomo logs them) adds no column
    _log(client, exp_id, "no-memory", {"no-memory.judge.overall": 0.05, "no-memory.f1.temporal": 0.125,
                                       "no-memory.n.overall": 20}, parent=parent)
    return uri, parent, old


def test_report_latest_run_with_child(tracked):
    uri, parent, old = tracked
    text = report(uri)
    assert parent in text and "locomo-full" in text
    lines = text.splitlines()
    header = next(l for l in lines if l.startswith("metric"))
    # parent systems, then the child's un-prefixed system (its run name) and its clashing "nemori"
    assert header.split() == ["metric", "category", "nemori", "no-memory", "rag-child", "rag-child/nemori"]
    overall = next(l for l in lines if l.startswith("judge") and "overall" in l)
    assert overall.split() == ["judge", "overall", "75.0", "(n=20)", "5.0", "(n=20)", "60.0", "(n=20)", "70.0"]
    temporal = next(l for l in lines if l.startswith("judge") and "temporal" in l)
    assert temporal.split() == ["judge", "temporal", "50.0", "(n=4)", "-", "-", "-"]
    assert any(l.startswith("f1") and "overall" in l and "43.2 (n=20)" in l for l in lines)
    assert any(l.startswith("f1") and "temporal" in l and "12.5" in l for l in lines)
    # run-wide n.<category> fills in systems without their own count
    assert next(l for l in lines if "single-hop" in l).split() == ["judge", "single-hop", "100.0", "(n=7)", "-", "-", "-"]
    assert not any("multi-hop" in l for l in lines)  # no values → row omitted
    # cost table: narrate 400 of 500 tokens = 80 %, answer 20 %
    narrate = next(l for l in lines if l.startswith("narrate"))
    assert narrate.split() == ["narrate", "6", "300", "100", "400", "80.0", "2.5", "0.0000"]
    assert next(l for l in lines if l.startswith("total")).split()[:6] == ["total", "8", "400", "100", "500", "100.0"]
    # an explicit run id picks that run
    assert "10.0" in report(uri, run_id=old) and "older" in report(uri, run_id=old)
    with pytest.raises(ConfigError, match="Fix:"):
        report(uri, experiment="missing")


def test_report_on_a_missing_sqlite_store_errors_without_creating_it(tmp_path):
    missing = tmp_path / "mlruns.db"
    with pytest.raises(ConfigError, match="no MLflow store at .*Fix:"):
        report(f"sqlite:///{missing}")
    assert not missing.exists()


def test_report_on_an_unknown_run_id_is_a_config_error(tracked):
    uri, _, _ = tracked
    with pytest.raises(ConfigError, match="no MLflow run 'nonexistent'.*Fix:"):
        report(uri, run_id="nonexistent")


def test_compare_an_eval_run_with_an_optimize_run(tracked):
    from nemori_dspy.eval.report import compare

    uri, parent, _ = tracked
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name("nemori-dspy").experiment_id
    opt = _log(client, exp_id, "optimize-narrate", {
        "narrate.dev.before": 0.4, "narrate.dev.before.low": 0.2, "narrate.dev.before.high": 0.6,
        "narrate.dev.after": 0.5, "narrate.dev.after.low": 0.3, "narrate.dev.after.high": 0.7, "narrate.dev.n": 10,
        "narrate.dev.temporal.before": 0.25, "narrate.dev.temporal.after": 0.75,
        "narrate.cost.narrate.calls": 40, "narrate.cost.narrate.input_tokens": 900,
        "narrate.cost.narrate.output_tokens": 100, "narrate.cost.answer.calls": 5})
    text = compare(uri, parent, opt)
    lines = text.splitlines()
    assert text.startswith(f"A: locomo-full ({parent}") and f"B: optimize-narrate ({opt}" in text
    after = next(l for l in lines if l.startswith("narrate dev after") and "overall" in l)
    assert after.endswith("50.0 [30.0, 70.0] n=10") and " - " in after  # A has no such row
    assert any(l.startswith("narrate dev before") and "temporal" in l and "25.0" in l for l in lines)
    assert any(l.startswith("nemori judge") and "overall" in l and "75.0" in l for l in lines)  # A: logged means
    cost_b = text.split("## Construction cost per stage, B")[1]
    assert next(l for l in cost_b.splitlines() if l.startswith("narrate")).split()[:4] == ["narrate", "40", "900", "100"]
    assert "answer" not in cost_b.split("## Prompts")[0]  # answering is no construction cost
    assert "(no prompt.* params)" in text
    with pytest.raises(ConfigError, match="no MLflow run"):
        compare(uri, parent, "0" * 32)


# ------------------------------------------------------------------ paired differences of two runs (issue 19)

def _answers(system: str, judge: list[float], sample: str = "c1") -> list[dict]:
    return [{"system": system, "sample_id": sample, "index": i, "category": 1 + i % 4,
             "category_name": ["multi-hop", "temporal", "open-domain", "single-hop"][i % 4], "judge": j, "f1": j / 2}
            for i, j in enumerate(judge)]


def test_paired_runs_pair_the_same_system_across_runs_by_question():
    from nemori_dspy.eval.report import paired_runs, paired_runs_table

    a = _answers("nemori", [0, 0, 0, 0, 1, 1]) + _answers("no-memory", [0] * 6)
    b = _answers("nemori", [1, 1, 1, 1, 1]) + _answers("rag-4096", [1] * 6)  # B skipped question 5
    paired = paired_runs(a, b)
    assert set(paired) == {"nemori"}  # only systems both runs answered with
    judge = paired["nemori"]["judge"]
    assert judge["n"] == 5 and (judge["wins"], judge["losses"]) == (4, 0) and judge["mcnemar_p"] == 0.125
    text = paired_runs_table(paired)
    assert "nemori  judge" in text and "4/0" in text and "0.125" in text
    # one system each, named differently (e.g. a run of nemori vs a run of nemori-s): paired with each other
    one = paired_runs(_answers("nemori", [1, 0]), _answers("nemori-s", [0, 0]))
    assert list(one) == ["nemori → nemori-s"] and one["nemori → nemori-s"]["judge"]["losses"] == 1
    assert paired_runs(a, _answers("nemori", [1], sample="other")) == {}
    assert "no question" in paired_runs_table({})


def test_compare_two_eval_runs_prints_their_paired_differences(tracked, tmp_path):
    import json

    from mlflow.tracking import MlflowClient

    from nemori_dspy.eval.report import compare

    uri, parent, old = tracked
    client = MlflowClient(tracking_uri=uri)
    for run_id, rows in ((parent, _answers("nemori", [0] * 10 + [1] * 10)), (old, _answers("nemori", [1] * 20))):
        path = tmp_path / run_id / "results.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        client.log_artifact(run_id, str(path))
    text = compare(uri, parent, old)
    section = text.split("## Paired differences B − A")[1].split("## Construction")[0]
    judge = next(l for l in section.splitlines() if l.startswith("nemori") and " judge " in l)
    assert judge.split()[:5] == ["nemori", "judge", "20", "50.0", "100.0"]
    assert "+50.0 [" in judge and "10/0" in judge and "0.002" in judge  # 2 · 2^-10 = 0.00195
