"""``eval.genai`` and the MLflow GenAI record of an eval, read back from a sqlite MLflow store in ``tmp_path`` after
``nemori-dspy eval locomo`` runs on a scripted LM: judge verdicts (and the strict judge's findings) as assessments on
each answer's trace, the slice as the runs' input, child-run metrics without the system prefix, ``@latest-eval`` /
``@tuned`` prompt aliases and ``--program prompts:/...``, and ``eval locomo --genai`` (``mlflow.genai.evaluate``
with our scorers over a logged evaluation dataset)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from nemori_dspy.apps.cli import main  # noqa: E402
from nemori_dspy.config import NemoriSettings  # noqa: E402
from nemori_dspy.eval.model import ProgramModel, program_state  # noqa: E402
from nemori_dspy.eval.report import report  # noqa: E402
from nemori_dspy.eval.tracking import RUN_FILE, stage_prompts  # noqa: E402
from nemori_dspy.optimizers.tracking import register_stage_prompt  # noqa: E402
from tests.fakes import SYNTHETIC_MINI, ScriptedLM, chat_reply, default_responders, install_scripted_runtime  # noqa: E402,E501


def _args(tmp: Path, out: str, *extra: str) -> list[str]:
    return ["eval", "locomo", "--data", str(SYNTHETIC_MINI), "--max-questions", "3", "--embedder", "hashing-64",
            "--out", str(tmp / out), "--mlflow-tracking-uri", f"sqlite:///{tmp}/mlflow.db", *extra]


def _runs(tmp: Path, out: str) -> tuple[str, dict[str, str]]:
    saved = json.loads((tmp / out / RUN_FILE).read_text())
    return saved["parent"], saved["children"]


def _responders() -> dict:
    """Default replies, but the generous judge says CORRECT to any answer but "I don't know" (its reason: "an
    answer"): nemori (which has context) is judged CORRECT, no-memory WRONG."""
    responders = default_responders()
    responders["JudgeAnswer"] = lambda i: chat_reply(
        reasoning="an answer", label="WRONG" if "know" in i["generated_answer"] else "CORRECT")
    return responders


def _eval(tmp_path_factory, mlflow_template, name: str, *extra: str):
    tmp = tmp_path_factory.mktemp(name)
    shutil.copy(mlflow_template, tmp / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        install_scripted_runtime(mp, tmp / "cache", ScriptedLM(_responders()))
        assert main(_args(tmp, "run", "--system", "nemori,no-memory", "--judge", "both", *extra)) == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    return tmp


@pytest.fixture(scope="module")
def judged(tmp_path_factory, mlflow_template):
    """One traced eval: nemori + no-memory, 3 questions, both judges."""
    return _eval(tmp_path_factory, mlflow_template, "judged")


@pytest.fixture(scope="module")
def genai(tmp_path_factory, mlflow_template):
    """The same eval through ``--genai``."""
    return _eval(tmp_path_factory, mlflow_template, "genai", "--genai")


def _answer_traces(run_id: str) -> list:
    traces = mlflow.search_traces(run_id=run_id, return_type="list", max_results=1000)
    return [t for t in traces if t.info.tags.get("mlflow.traceName", "").startswith("answer ")]


def _rows(tmp: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp / "run/results.jsonl").read_text().splitlines() if x.strip()]


def test_each_answer_trace_carries_the_judges_verdicts_and_the_gold(judged):
    parent, _ = _runs(judged, "run")
    traces = _answer_traces(parent)
    rows = {(r["system"], r["sample_id"], r["index"]): r for r in _rows(judged)}
    models = {j: mlflow.get_run(parent).data.params[f"{j}.model"] for j in ("judge", "judge_strict")}
    assert len(traces) == len(rows) == 6
    wrong = 0
    for t in traces:
        row = rows[(t.info.tags["system"], t.info.tags["conversation"], int(t.info.tags["question"]))]
        by_name = {a.name: a for a in t.info.assessments}
        assert by_name["expected_response"].value == row["gold"]
        for judge in ("judge", "judge_strict"):
            fb = by_name[judge]
            assert fb.value == ("yes" if row[judge] == 1.0 else "no")
            assert fb.metadata["label"] == row["verdicts"][judge]["label"]
            assert fb.source.source_type == "LLM_JUDGE" and fb.source.source_id == models[judge]
        assert by_name["judge"].rationale == "an answer"  # the generous judge's reasoning
        findings = row["verdicts"]["judge_strict"]["findings"]
        assert by_name["judge_strict.key_facts_present"].value is findings["key_facts_present"]
        assert by_name["judge_strict.contradicts_gold"].value is findings["contradicts_gold"]
        assert "key_facts_present" in by_name["judge_strict"].rationale
        wrong += by_name["judge"].metadata["label"] == "WRONG"
        assert (by_name["judge"].value == "no") == (t.info.tags["system"] == "no-memory")
    assert wrong == 3  # filterable: the WRONG answers are no-memory's three


def test_the_slice_is_the_input_of_every_run(judged):
    parent, children = _runs(judged, "run")
    for run_id in [parent, *children.values()]:
        inputs = mlflow.get_run(run_id).inputs.dataset_inputs
        assert len(inputs) == 1
        ds, tags = inputs[0].dataset, {t.key: t.value for t in inputs[0].tags}
        assert ds.name == "locomo synth-1; max 3/conversation" and tags["mlflow.data.context"] == "eval"
        assert ds.source_type == "local" and SYNTHETIC_MINI.name in ds.source
        assert json.loads(ds.profile)["num_rows"] == 3
    assert mlflow.get_run(parent).inputs.dataset_inputs[0].dataset.digest == \
        mlflow.get_run(children["nemori"]).inputs.dataset_inputs[0].dataset.digest


def test_child_runs_log_unprefixed_metrics_the_parent_keeps_the_prefixed_ones(judged):
    parent, children = _runs(judged, "run")
    p = mlflow.get_run(parent).data.metrics
    for system, run_id in children.items():
        m = mlflow.get_run(run_id).data.metrics
        assert m["judge.overall"] == p[f"{system}.judge.overall"]
        assert m["judge_strict.overall"] == p[f"{system}.judge_strict.overall"]
        assert not any(k.startswith(f"{system}.") for k in m)
    # the compare view lines up: the same metric names on both children
    names = [{k for k in mlflow.get_run(r).data.metrics if not k.startswith(("running.", "recall_at"))}
             for r in children.values()]  # no-memory retrieves nothing: it has no recall
    assert names[0] == names[1]
    text = report(f"sqlite:///{judged}/mlflow.db", parent).splitlines()
    header = next(line for line in text if line.startswith("metric"))
    assert header.split()[2:] == ["nemori", "no-memory"]  # no extra column from a child
    # a child shown alone: its un-prefixed metrics under its run name
    assert "nemori" in report(f"sqlite:///{judged}/mlflow.db", children["nemori"]).splitlines()[3]


def test_a_finished_eval_moves_latest_eval_to_the_prompts_it_ran(judged):
    parent, _ = _runs(judged, "run")
    params = mlflow.get_run(parent).data.params
    prompt = mlflow.genai.load_prompt("prompts:/nemori-dspy-answer@latest-eval")
    assert int(prompt.version) == int(params["prompt_version.answer"])
    assert prompt.tags["stage"] == "answer"


def test_tuned_alias_and_program_from_a_registered_prompt(judged, monkeypatch):
    """optimize registers a tuned prompt under @tuned; eval --program prompts:/...@tuned runs it (and the rest as
    the default program), and its record points at that version."""
    settings = NemoriSettings()
    state = program_state(ProgramModel(settings))
    state["response.answer.predict"]["signature"]["instructions"] += " Answer in five words."
    tuned = stage_prompts(ProgramModel(settings, state))["answer"]
    version = register_stage_prompt("answer", tuned, "tuned by a test")
    assert mlflow.genai.load_prompt("prompts:/nemori-dspy-answer@tuned").template == tuned
    install_scripted_runtime(monkeypatch, judged / "cache", ScriptedLM(default_responders()))
    assert main(_args(judged, "tuned", "--system", "nemori", "--no-judge", "--program",
                      "prompts:/nemori-dspy-answer@tuned")) == 0
    ran = json.loads((judged / "tuned/program.json").read_text())
    assert ran["response.answer.predict"]["signature"]["instructions"].endswith("Answer in five words.")
    assert ran["episodic.narrate.predict"]["signature"] == state["episodic.narrate.predict"]["signature"]
    params = mlflow.get_run(_runs(judged, "tuned")[0]).data.params
    assert params["prompt_version.answer"] == str(version) and params["program"] == "prompts:/nemori-dspy-answer@tuned"
    # the eval that ran it moved @latest-eval there too
    assert int(mlflow.genai.load_prompt("prompts:/nemori-dspy-answer@latest-eval").version) == version


def test_unknown_prompt_alias_fails_before_any_model(judged, monkeypatch, capsys):
    import nemori_dspy.runtime as runtime

    monkeypatch.setattr(runtime, "build_runtime", lambda *a, **k: pytest.fail("model loaded"))
    assert main(_args(judged, "bad", "--program", "prompts:/nemori-dspy-answer@nope")) == 2
    err = capsys.readouterr().err
    assert "prompts:/nemori-dspy-answer@nope" in err and "Fix:" in err
    assert main(_args(judged, "bad", "--program", "a.json", "--program", "b.json")) == 2
    assert "2 programs" in capsys.readouterr().err


def test_genai_evaluate_runs_our_scorers_per_system_over_a_logged_dataset(genai, judged):
    parent, children = _runs(genai, "run")
    for system, run_id in children.items():
        run = mlflow.get_run(run_id)
        m = run.data.metrics
        assert {"judge/mean", "judge_strict/mean", "f1/mean", "f1_locomo/mean", "bleu1/mean",
                "judge_strict.key_facts_present/mean"} <= set(m)
        assert m["judge/mean"] == pytest.approx(m["judge.overall"])  # evaluate's mean = the eval's own score
        assert m["f1/mean"] == pytest.approx(m["f1.overall"])
        assert run.data.tags["mlflow.runType"] == "genai_evaluate" and run.info.status == "FINISHED"
        names = {i.dataset.name for i in run.inputs.dataset_inputs}
        assert any(n.startswith("nemori-dspy-locomo-") for n in names) and "locomo synth-1; max 3/conversation" in names
        traces = mlflow.search_traces(run_id=run_id, return_type="list", max_results=100)
        assert len(traces) == 3
        for t in traces:
            by_name = {a.name: a for a in t.info.assessments}
            assert {"judge", "judge_strict", "f1", "recall_at_5"} <= set(by_name)
            assert by_name["judge"].source.source_type == "LLM_JUDGE"
            assert any(s.attributes.get("nemori.stage") == "answer" for s in t.data.spans)  # our LM span inside
            assert not any(s.attributes.get("nemori.stage", "").startswith("judge") for s in t.data.spans)
    nemori = mlflow.get_run(children["nemori"]).data.metrics
    assert "recall_at_5/mean" in nemori  # no-memory retrieves nothing: no recall
    ds = mlflow.genai.datasets.search_datasets(filter_string="name LIKE 'nemori-dspy-locomo-%'")
    assert len(ds) == 1 and len(ds[0].to_df()) == 3
    # the same answer rows, summary and parent metrics as run_locomo's
    rows = _rows(genai)
    assert [(r["system"], r["index"]) for r in rows] == [("nemori", i) for i in sorted({r["index"] for r in rows})] + \
        [("no-memory", i) for i in sorted({r["index"] for r in rows})]
    assert all({"judge", "judge_strict", "f1", "recall_at_5", "verdicts", "answer"} <= set(r) for r in rows)
    assert sorted((r["system"], r["index"], r["answer"], r["judge"]) for r in rows) == \
        sorted((r["system"], r["index"], r["answer"], r["judge"]) for r in _rows(judged))
    p = mlflow.get_run(parent).data.metrics
    assert p["nemori.judge.overall"] == nemori["judge.overall"] and "cost.answer.calls" in p


def test_genai_refuses_resume_and_no_mlflow(tmp_path, capsys):
    assert main(_args(tmp_path, "run", "--genai", "--resume")) == 2
    err = capsys.readouterr().err
    assert "--genai" in err and "Fix:" in err
    assert main(_args(tmp_path, "run", "--genai", "--no-mlflow")) == 2
