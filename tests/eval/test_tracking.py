"""``eval.tracking``: the live MLflow record of an eval, driven end to end through ``nemori-dspy eval locomo``
with a scripted LM and a temporary sqlite MLflow store: rows and params visible while the eval runs, one span
per LLM call, a killed run ends KILLED (or is marked so when its process is gone) and ``--resume`` finishes the
same run, prompt registry versions follow the prompt text that runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from nemori_dspy.apps.cli import main  # noqa: E402
from nemori_dspy.config import NemoriSettings  # noqa: E402
from nemori_dspy.eval.model import ProgramModel  # noqa: E402
from nemori_dspy.eval.tracking import RUN_FILE, mark_stale_runs, register_prompts, stage_prompts  # noqa: E402
from tests.fakes import SYNTHETIC_MINI, ScriptedLM, default_responders, install_scripted_runtime  # noqa: E402


def _args(tmp: Path, *extra: str) -> list[str]:
    return ["eval", "locomo", "--data", str(SYNTHETIC_MINI), "--max-questions", "3", "--embedder", "hashing-64",
            "--out", str(tmp / "run"), "--mlflow-tracking-uri", f"sqlite:///{tmp}/mlflow.db", *extra]


def _client(tmp: Path) -> object:
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    return mlflow.MlflowClient()


def _parent(tmp: Path) -> str:
    return json.loads((tmp / "run" / RUN_FILE).read_text())["parent"]


def _rows(run_id: str) -> list[tuple]:
    df = mlflow.load_table("answers.json", run_ids=[run_id])
    return list(zip(df["system"], df["sample_id"], df["index"]))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, mlflow_template):
    """One eval (nemori + no-memory, 3 questions, judged) whose answer responder looks at MLflow mid-run."""
    tmp = tmp_path_factory.mktemp("tracked")
    shutil.copy(mlflow_template, tmp / "mlflow.db")
    seen: dict[str, object] = {}
    responders = default_responders()
    answer = responders["AnswerQuestion"]
    count = {"n": 0}

    def watching_answer(inputs: dict[str, str]) -> str:
        count["n"] += 1
        if count["n"] == 4:  # three answers are in; the eval is still running
            client = _client(tmp)
            run = client.get_run(_parent(tmp))
            seen.update(status=run.info.status, params=dict(run.data.params), rows=_rows(run.info.run_id),
                        progress=[m.value for m in client.get_metric_history(run.info.run_id, "progress.answers")])
        return answer(inputs)

    responders["AnswerQuestion"] = watching_answer
    with pytest.MonkeyPatch.context() as mp:
        lm = install_scripted_runtime(mp, tmp / "cache", ScriptedLM(responders))
        assert main(_args(tmp, "--system", "nemori,no-memory")) == 0
    return tmp, _parent(tmp), seen, lm


def test_run_shows_params_and_answers_while_it_runs(finished):
    tmp, run_id, seen, _ = finished
    assert seen["status"] == "RUNNING"
    assert seen["params"]["dataset.sha256"] and seen["params"]["model_label"] == "scripted"
    assert seen["params"]["prompt_version.narrate"] == "1" and "prompt.narrate" in seen["params"]
    assert len(seen["rows"]) == 3 and seen["progress"] == [1.0, 2.0, 3.0]
    run = _client(tmp).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert sorted(_rows(run_id)) == sorted({(r[0], r[1], r[2]) for r in _rows(run_id)})  # no duplicates
    assert len(_rows(run_id)) == 6
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{run_id}'", output_format="list")
    assert {c.info.run_name: c.info.status for c in children} == {"nemori": "FINISHED", "no-memory": "FINISHED"}
    assert all("running.f1" in c.data.metrics for c in children)


def test_every_llm_call_is_one_span_with_its_stage_and_tokens(finished):
    tmp, run_id, _, _ = finished
    _client(tmp)
    usage = json.loads((tmp / "run/summary.json").read_text())["usage"]
    traces = mlflow.search_traces(run_id=run_id, return_type="list", max_results=1000)
    spans = [s for t in traces for s in t.data.spans if "nemori.stage" in s.attributes]
    assert len(spans) == sum(u["calls"] + u["cache_hits"] for u in usage.values())
    by_stage: dict[str, list[int]] = {}
    for s in spans:
        by_stage.setdefault(s.attributes["nemori.stage"], []).append(s.attributes["nemori.input_tokens"])
    assert {k: len(v) for k, v in by_stage.items()} == {k: u["calls"] + u["cache_hits"] for k, u in usage.items()}
    assert {k: sum(v) for k, v in by_stage.items()} == {k: u["input_tokens"] for k, u in usage.items()}
    answers = [t for t in traces if t.info.tags.get("mlflow.traceName", "").startswith("answer ")]
    assert len(answers) == 6 and {t.info.tags["system"] for t in answers} == {"nemori", "no-memory"}
    assert any(s.attributes.get("nemori.stage") == "answer" and s.outputs for t in answers for s in t.data.spans)


def test_logged_model_loads_as_the_program_that_ran(finished):
    tmp, run_id, _, _ = finished
    _client(tmp)
    model = mlflow.dspy.load_model(f"runs:/{run_id}/program")
    mlflow.clear_active_model()  # load_model made it MLflow's active model (other tests log to other stores)
    saved = json.loads((tmp / "run/program.json").read_text())
    loaded = model.dump_state()
    assert set(loaded) == set(saved) - {"metadata"}
    assert all({**loaded[k], "lm": None} == {**saved[k], "lm": None} for k in loaded)


def test_tracing_off_by_setting(tmp_path, monkeypatch, mlflow_db):
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(default_responders()))
    monkeypatch.setenv("NEMORI_MLFLOW_TRACING", "false")
    assert main(_args(tmp_path, "--system", "no-memory", "--no-judge", "--max-questions", "1")) == 0
    _client(tmp_path)
    assert mlflow.search_traces(run_id=_parent(tmp_path), return_type="list") == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_killed_run_ends_killed_and_resume_finishes_the_same_run(tmp_path, monkeypatch, mlflow_db):
    responders = default_responders()
    answer, count = responders["AnswerQuestion"], {"n": 0}

    def interrupted(inputs: dict[str, str]) -> str:
        count["n"] += 1
        if count["n"] == 3:
            raise KeyboardInterrupt
        return answer(inputs)

    responders["AnswerQuestion"] = interrupted
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(responders))
    with pytest.raises(KeyboardInterrupt):
        main(_args(tmp_path, "--system", "nemori", "--no-judge"))
    client, run_id = _client(tmp_path), _parent(tmp_path)
    assert client.get_run(run_id).info.status == "KILLED"
    assert len(_rows(run_id)) == 2
    # its report shows the scores of the answers it logged (it logged no score metrics)
    from nemori_dspy.eval.report import report

    text = report(mlflow.get_tracking_uri(), run_id)
    assert "KILLED" in text and "answers logged so far" in text and "(no score metrics" not in text
    assert any(line.startswith("f1") and "overall" in line and "(n=2)" in line for line in text.splitlines())
    # kill -9: no handler ran, the run is RUNNING and its process is gone → the next start marks it KILLED
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, "nemori.pid", str(_dead_pid()))
    other = client.create_run(client.get_run(run_id).info.experiment_id, tags={
        "nemori.host": client.get_run(run_id).data.tags["nemori.host"], "nemori.pid": str(os.getppid())})
    assert mark_stale_runs(client, client.get_run(run_id).info.experiment_id) == [run_id]
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_run(other.info.run_id).info.status == "RUNNING"  # its process is alive
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, "nemori.pid", str(_dead_pid()))
    assert main(_args(tmp_path, "--system", "nemori", "--no-judge", "--resume")) == 0
    run = client.get_run(run_id)
    assert _parent(tmp_path) == run_id and run.info.status == "FINISHED" and "nemori.resumed" in run.data.tags
    assert sorted(_rows(run_id)) == [("nemori", "synth-1", i) for i in sorted(r[2] for r in _rows(run_id))]
    assert len(_rows(run_id)) == 3
    history = client.get_metric_history(run_id, "progress.answers")
    assert max(m.step for m in history) >= 1 and "nemori.f1.overall" in run.data.metrics


def test_prompt_versions_follow_the_text_that_runs(mlflow_db):
    mlflow.set_tracking_uri(mlflow_db)
    settings = NemoriSettings()
    default = stage_prompts(ProgramModel(settings))
    first = register_prompts(default)
    assert set(first.values()) == {1} and {"narrate", "answer", "partition"} <= set(first)
    assert register_prompts(stage_prompts(ProgramModel(settings))) == first  # unchanged → same versions
    state = ProgramModel(settings).dump_state()
    state["episodic.narrate.predict"]["signature"]["instructions"] += " Keep it short."
    tuned = stage_prompts(ProgramModel(settings, state))
    assert tuned["narrate"] != default["narrate"] and {k: v for k, v in tuned.items() if k != "narrate"} == \
        {k: v for k, v in default.items() if k != "narrate"}
    second = register_prompts(tuned)
    assert second == {**first, "narrate": 2}
    state["episodic.narrate.predict"]["demos"] = [{"messages": "m", "cue": "c", "narrative": "n"}]
    assert register_prompts(stage_prompts(ProgramModel(settings, state)))["narrate"] == 3  # demos count too
    assert register_prompts(tuned)["narrate"] == 2 and register_prompts(default) == first  # texts that ran before


def test_a_threaded_eval_logs_every_answer_once_each_in_its_own_trace(tmp_path, monkeypatch, mlflow_db):
    """--concurrency 4: answers finish out of order in worker threads; the table, the progress steps and the traces
    still hold each answer once, and each answer's trace holds that question's own LLM calls."""
    import time

    from nemori_dspy.eval.locomo import load_locomo

    responders = default_responders()
    answer = responders["AnswerQuestion"]

    def uneven(inputs: dict[str, str]) -> str:
        time.sleep(0.03 * (len(inputs["question"]) % 3))  # later questions may finish first
        return answer(inputs)

    responders["AnswerQuestion"] = uneven
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(responders))
    assert main(_args(tmp_path, "--system", "nemori,no-memory", "--max-questions", "6", "--concurrency", "4")) == 0
    client, run_id = _client(tmp_path), _parent(tmp_path)
    rows = _rows(run_id)
    assert len(rows) == len(set(rows)) == 12
    history = client.get_metric_history(run_id, "progress.answers")
    assert sorted(m.value for m in history) == [float(i) for i in range(1, 13)]
    assert client.get_run(run_id).data.params["concurrency"] == "4"
    questions = {q.index: q.question for q in load_locomo(SYNTHETIC_MINI)[0].questions}
    traces = [t for t in mlflow.search_traces(run_id=run_id, return_type="list", max_results=1000)
              if t.info.tags.get("mlflow.traceName", "").startswith("answer ")]
    assert len(traces) == 12
    for t in traces:
        stages = sorted(s.attributes["nemori.stage"] for s in t.data.spans if "nemori.stage" in s.attributes)
        assert stages == ["answer", "judge"]  # its own two calls, none of another thread's
        asked = next(s for s in t.data.spans if s.attributes.get("nemori.stage") == "answer")
        assert questions[int(t.info.tags["question"])] in json.dumps(asked.inputs)
