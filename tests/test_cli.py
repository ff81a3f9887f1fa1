"""``nemori-dspy eval locomo`` end to end through ``main()`` with a scripted LM: systems side by side,
memory reuse, resume after an interruption, MLflow parent/child runs, report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nemori_dspy.runtime as runtime
from nemori_dspy.apps.cli import main
from tests.fakes import SYNTHETIC_MINI, ScriptedLM, chat_reply, default_responders, install_scripted_runtime


@pytest.fixture
def scripted_runtime(monkeypatch, tmp_path, mlflow_db):  # mlflow_db: a migrated store at tmp_path/mlflow.db
    return install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(default_responders()))


def _run(tmp_path, *extra):
    return main(["eval", "locomo", "--data", str(SYNTHETIC_MINI), "--max-questions", "3", "--embedder", "hashing-64",
                 "--out", str(tmp_path / "run"), "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *extra])


def test_systems_side_by_side_then_resume_and_reuse(tmp_path, scripted_runtime, capsys):
    systems = "nemori,full-context,rag-4096,no-memory"
    assert _run(tmp_path, "--system", systems) == 0
    out = capsys.readouterr().out
    for name in systems.split(","):
        assert name in out
    assert "in exactly one episode" in out and "share" in out and "MLflow run" in out
    embed_line = next(x for x in out.splitlines() if x.startswith("Embedding calls (apart from LLM calls)"))
    assert int(embed_line.split(": ")[1].split(" calls")[0]) > 0
    rows = [json.loads(x) for x in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3
    assert all(r["recall_at_10"] == 1.0 for r in rows if r["system"] == "full-context")
    assert all(r["recall_at_1"] is None for r in rows if r["system"] == "no-memory")

    first = json.loads((tmp_path / "run/summary.json").read_text())
    assert first["construction_usage"]["narrate"]["calls"] > 0
    # interrupted run: drop the last 5 answers, resume → only those are redone, memory is reused
    (tmp_path / "run/results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:-5]))
    (tmp_path / "run/summary.json").unlink()  # a killed run never wrote it; cost.json is checkpointed
    calls_before = scripted_runtime.calls.get("AnswerQuestion", 0)
    narrate_before = scripted_runtime.calls.get("NarrateEpisode", 0)
    assert _run(tmp_path, "--system", systems, "--resume", "--no-mlflow") == 0
    out = capsys.readouterr().out
    assert "resumed: 7 answers" in out and "reused memory" in out
    assert scripted_runtime.calls["AnswerQuestion"] - calls_before == 5
    assert scripted_runtime.calls["NarrateEpisode"] == narrate_before
    assert len((tmp_path / "run/results.jsonl").read_text().splitlines()) == 12
    # the run folder still reports the whole run's cost: construction from the first invocation, answers from both
    # (the first invocation's answers all count, incl. the 5 whose rows were dropped: their calls were made)
    resumed = json.loads((tmp_path / "run/summary.json").read_text())
    assert resumed["construction_usage"] == first["construction_usage"]
    assert resumed["usage"]["answer"]["calls"] == first["usage"]["answer"]["calls"] + 5
    assert resumed["counters"]["insights"] == first["counters"]["insights"] > 0
    assert "evoked context empty" in out


def test_changed_construction_setting_does_not_reuse_memory(tmp_path, scripted_runtime, capsys):
    assert _run(tmp_path, "--system", "nemori", "--no-mlflow", "--no-judge") == 0
    capsys.readouterr()
    assert _run(tmp_path, "--system", "nemori", "--no-mlflow", "--no-judge", "--window-size", "10",
                "--out", str(tmp_path / "run2")) == 0
    assert "reused memory" not in capsys.readouterr().out
    # same construction into a new run folder: memory is reused, and its counters are not shown as zeros
    assert _run(tmp_path, "--system", "nemori", "--no-mlflow", "--no-judge", "--out", str(tmp_path / "run3")) == 0
    out = capsys.readouterr().out
    assert "reused memory" in out and "construction counters: n/a" in out and "evoked context empty 0/0" not in out


def test_mlflow_parent_and_child_runs_with_charts_and_prompts(tmp_path, scripted_runtime, capsys):
    import mlflow

    assert _run(tmp_path, "--system", "nemori,no-memory") == 0
    run_id = capsys.readouterr().out.split("MLflow run ")[1].split()[0]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    parent = mlflow.get_run(run_id)
    assert parent.data.params["prompt_version.narrate"] == "1"
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{run_id}'", output_format="list")
    assert {c.info.run_name for c in children} == {"nemori", "no-memory"}
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}
    assert {"results.jsonl", "cost_by_stage.png", "prompts.json", "program.json"} <= artifacts
    assert any(a.startswith("scores_by_category") for a in artifacts)
    # artifacts sit beside the tracking database, not in the folder the process happened to run from
    assert list((tmp_path / "mlruns").rglob("results.jsonl"))
    assert main(["report", "--run-id", run_id, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    assert "no-memory" in capsys.readouterr().out


CANARY = "sk-canary-0123456789abcdef"


def test_api_key_never_reaches_logs_files_or_mlflow(tmp_path, scripted_runtime, monkeypatch, capsys):
    """A key given by environment flows into settings but into no output: stdout/stderr, DEBUG logs,
    the run folder, the memory cache, program.json, or the MLflow store and artifacts."""
    import logging

    seen = {}
    fake = runtime.build_runtime

    def build(settings, configure=True):
        seen["key"] = settings.api_key.get_secret_value() if settings.api_key else None
        return fake(settings, configure)

    monkeypatch.setattr(runtime, "build_runtime", build)
    monkeypatch.setenv("NEMORI_API_KEY", CANARY)
    log_file = tmp_path / "debug.log"
    handler = logging.FileHandler(log_file)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for lg in list(logging.root.manager.loggerDict.values()):  # earlier imports (mlflow) may disable some
        if isinstance(lg, logging.Logger):
            lg.disabled = False
    try:
        assert _run(tmp_path, "--system", "nemori,no-memory", "--verbose") == 0
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
    assert seen["key"] == CANARY  # the key really was in the settings the run used
    out = capsys.readouterr()
    assert CANARY not in out.out and CANARY not in out.err
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files) and log_file.stat().st_size > 0
    leaked = [str(p) for p in files if CANARY.encode() in p.read_bytes()]
    assert leaked == []


def test_invalid_setting_fails_fast_naming_field_its_source_and_fix(monkeypatch, capsys):
    def no_model(*a, **k):  # an invalid setting must be caught before any model is loaded
        raise AssertionError("runtime built despite an invalid setting")

    monkeypatch.setattr(runtime, "build_runtime", no_model)
    with pytest.raises(SystemExit) as usage:  # a choice setting is checked by click, naming the flag and choices
        main(["eval", "locomo", "--local-model-size", "3b", "--data", "x.json"])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and "'--local-model-size'" in err and "'0.5b', '1.5b'" in err
    assert main(["eval", "locomo", "--window-size", "0", "--data", "x.json"]) == 2
    err = capsys.readouterr().err
    assert "window_size (given as --window-size" in err and "Fix:" in err
    assert main(["eval", "locomo", "--judge-model", "local:3b", "--data", "x.json"]) == 2
    assert "judge_model" in capsys.readouterr().err
    assert "Traceback" not in err
    monkeypatch.setenv("NEMORI_WINDOW_SIZE", "0")
    assert main(["eval", "locomo", "--data", "x.json"]) == 2
    assert "window_size (env NEMORI_WINDOW_SIZE)" in capsys.readouterr().err


def test_bad_program_store_or_counts_fail_before_any_model_is_loaded(monkeypatch, capsys, tmp_path):
    def no_model(*a, **k):
        raise AssertionError("runtime built despite a bad argument")

    monkeypatch.setattr(runtime, "build_runtime", no_model)
    base = ["eval", "locomo", "--data", str(SYNTHETIC_MINI), "--out", str(tmp_path / "run")]
    assert main([*base, "--program", str(tmp_path / "missing.json")]) == 2
    assert "--program" in (err := capsys.readouterr().err) and "Fix:" in err
    monkeypatch.setenv("NEMORI_STORE", "weaviate")
    assert main(base) == 2
    assert "NEMORI_WEAVIATE_URL" in capsys.readouterr().err
    monkeypatch.delenv("NEMORI_STORE")
    for flag in ("--max-questions", "--concurrency"):
        with pytest.raises(SystemExit) as exc:
            main([*base, flag, "0"])
        assert exc.value.code == 2 and "give 1 or more" in capsys.readouterr().err


def test_locomo_path_from_dotenv_and_download_target_in_cache_dir(monkeypatch, tmp_path):
    from nemori_dspy.apps.context import resolve_dataset
    from nemori_dspy.config import load_settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"NEMORI_LOCOMO_PATH={tmp_path / 'locomo.json'}\n")
    assert resolve_dataset(None, load_settings()) == tmp_path / "locomo.json"
    assert resolve_dataset("given.json", load_settings()) == Path("given.json")
    (tmp_path / ".env").unlink()
    cache = tmp_path / "cache"
    (cache / "locomo10.json").parent.mkdir()
    (cache / "locomo10.json").write_text("[]")  # already downloaded: no network call
    assert resolve_dataset(None, load_settings(cache_dir=cache)) == cache / "locomo10.json"


def test_resume_picks_the_newest_run_that_answered_not_a_failed_start(tmp_path, monkeypatch):
    from nemori_dspy.apps.context import run_dir

    monkeypatch.chdir(tmp_path)
    real, failed = tmp_path / "runs/locomo-20260101-000000", tmp_path / "runs/locomo-20260101-010000"
    real.mkdir(parents=True)
    (real / "results.jsonl").write_text("")
    failed.mkdir()
    assert run_dir(None, "locomo", resume=True).resolve() == real.resolve()


def test_judge_audit_printed_in_summary_and_mlflow_and_off_with_0(tmp_path, scripted_runtime, capsys):
    import mlflow

    assert _run(tmp_path, "--system", "nemori", "--judge-audit", "2") == 0
    out = capsys.readouterr().out
    assert "Judge audit" in out and "gold → CORRECT" in out
    run_id = out.split("MLflow run ")[1].split()[0]
    audit = json.loads((tmp_path / "run/summary.json").read_text())["judge_audit"]["judge"]
    assert (audit["n_gold"], audit["n_wrong"], audit["n"]) == (2, 2, 4)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    metrics = mlflow.get_run(run_id).data.metrics
    assert metrics["judge_audit.judge.n"] == 4 and metrics["judge_audit.judge.overall"] == audit["overall"]
    assert "nemori.judge.overall" in metrics and "judge_audit.judge.overall" not in {
        k for k in metrics if k.startswith("nemori.")}
    assert main(["report", "--run-id", run_id, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    report = capsys.readouterr().out
    assert "Judge audit" in report and "judge_audit" not in report.split("## Judge audit")[0]
    assert _run(tmp_path, "--system", "nemori", "--judge-audit", "0", "--no-mlflow", "--out", str(tmp_path / "r0")) == 0
    assert "Judge audit" not in capsys.readouterr().out
    assert json.loads((tmp_path / "r0/summary.json").read_text())["judge_audit"] is None


def test_generous_and_strict_judges_side_by_side(tmp_path, scripted_runtime, capsys):
    import mlflow

    from nemori_dspy.eval.judge import JUDGE_PROMPT_HASH, JUDGE_STRICT_PROMPT_HASH

    assert _run(tmp_path, "--system", "nemori,no-memory", "--judge", "both", "--judge-audit", "2") == 0
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if x.startswith("system") and "category" in x)
    assert "judge" in header.split() and "judge_strict" in header.split()
    run_id = out.split("MLflow run ")[1].split()[0]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["judges"]["judge"]["prompt_hash"] == JUDGE_PROMPT_HASH
    assert summary["judges"]["judge_strict"]["prompt_hash"] == JUDGE_STRICT_PROMPT_HASH
    assert set(summary["judge_audit"]) == {"judge", "judge_strict"}
    scores = summary["scores"]["nemori"]
    assert "judge.overall" in scores and "judge_strict.overall" in scores
    # the scripted strict judge passes only the gold itself: never more than the generous one
    assert scores["judge_strict.overall"] <= scores["judge.overall"]
    assert scripted_runtime.calls["JudgeAnswerStrict"] >= 2 * 3 + 2 * 2  # 2 systems × 3 answers + the audit
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.get_run(run_id)
    assert run.data.params["judge.prompt_hash"] == JUDGE_PROMPT_HASH
    assert run.data.params["judge_strict.prompt_hash"] == JUDGE_STRICT_PROMPT_HASH
    assert run.data.params["prompt.judge_strict"] == JUDGE_STRICT_PROMPT_HASH
    assert "nemori.judge_strict.overall" in run.data.metrics and "judge_audit.judge_strict.overall" in run.data.metrics
    assert main(["report", "--run-id", run_id, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    assert "judge_strict" in capsys.readouterr().out
    # strict alone: its own column, no generous one
    assert _run(tmp_path, "--system", "nemori", "--judge", "strict", "--no-mlflow", "--out", str(tmp_path / "r2")) == 0
    scores = json.loads((tmp_path / "r2/summary.json").read_text())["scores"]["nemori"]
    assert "judge_strict.overall" in scores and "judge.overall" not in scores
    with pytest.raises(SystemExit):
        main(["eval", "locomo", "--judge", "lenient"])


@pytest.fixture
def lme_runtime(monkeypatch, tmp_path, mlflow_db):
    from tests.fakes import lme_responders
    from tests.fakes import LongMemEvalLM

    return install_scripted_runtime(monkeypatch, tmp_path / "cache", LongMemEvalLM(lme_responders()))


def test_eval_longmemeval_end_to_end_resume_mlflow_and_report(tmp_path, lme_runtime, capsys):
    import mlflow

    from tests.fakes import longmemeval_file as official_file

    data = official_file(tmp_path)
    args = ["eval", "longmemeval", "--data", str(data), "--embedder", "hashing-64", "--out", str(tmp_path / "run"),
            "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--system", "nemori,no-memory"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "4 question(s), one memory each" in out and "temporal-reasoning" in out and "Judge audit" in out
    assert "nemori (LongMemEval, ×100): judge task-averaged" in out
    run_id = out.split("MLflow run ")[1].split()[0]
    rows = [json.loads(x) for x in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.get_run(run_id)
    assert run.data.params["benchmark"] == "longmemeval" and run.data.params["judge.prompt_hash"]
    for name in ("nemori.judge.temporal-reasoning", "nemori.judge.abstention", "nemori.judge.task-averaged",
                 "no-memory.f1.overall", "judge_audit.judge.overall", "cost.narrate.calls"):
        assert name in run.data.metrics, name
    assert main(["report", "--run-id", run_id, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    report = capsys.readouterr().out
    assert "temporal-reasoning" in report and "task-averaged" in report and "Judge audit" in report

    # interrupted: drop the last 3 answers; --resume asks only those, memory is reused
    (tmp_path / "run/results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:-3]))
    answers, narrated = lme_runtime.calls["AnswerQuestion"], lme_runtime.calls["NarrateEpisode"]
    assert main([*args, "--resume", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "resumed: 5 answers" in out and "reused memory" in out
    assert lme_runtime.calls["AnswerQuestion"] - answers == 3 and lme_runtime.calls["NarrateEpisode"] == narrated
    assert len((tmp_path / "run/results.jsonl").read_text().splitlines()) == 8


def test_eval_longmemeval_filters_and_bad_input_fail_before_any_model(tmp_path, monkeypatch, capsys):
    from tests.fakes import longmemeval_file as official_file

    def no_model(*a, **k):
        raise AssertionError("runtime built despite bad input")

    monkeypatch.setattr(runtime, "build_runtime", no_model)
    data = official_file(tmp_path)
    assert main(["eval", "longmemeval", "--data", str(tmp_path / "missing.json")]) == 2
    assert "Fix:" in capsys.readouterr().err
    assert main(["eval", "longmemeval", "--data", str(data), "--question-types", "abstention"]) == 2
    assert "abstention" in capsys.readouterr().err
    assert main(["eval", "longmemeval", "--data", str(data), "--judge-audit", "-1"]) == 2
    assert "judge_audit (given as --judge-audit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "longmemeval"])  # --data is required


def test_program_from_a_run_reuses_its_memory_and_report_compares_the_runs(tmp_path, scripted_runtime, capsys):
    """A tuned program run, then ``--program runs:/<id>/program``: same construction key (memory reused), same
    prompt versions; ``report --compare`` shows the default and tuned runs side by side and names the prompt
    that differs."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert _run(tmp_path, "--system", "nemori", "--no-judge", "--out", str(tmp_path / "a")) == 0
    state = json.loads((tmp_path / "a/program.json").read_text())
    state["episodic.narrate.predict"]["signature"]["instructions"] += " Keep it short."
    (tmp_path / "tuned.json").write_text(json.dumps(state))
    assert _run(tmp_path, "--system", "nemori", "--no-judge", "--out", str(tmp_path / "b"),
                "--program", str(tmp_path / "tuned.json"), "--register-model", "nemori-tuned") == 0
    out = capsys.readouterr().out
    assert "reused memory" not in out.split("run folder")[-1]  # a tuned narrate prompt builds its own memory
    ids = {r: json.loads((tmp_path / r / "mlflow_run.json").read_text())["parent"] for r in "ab"}
    for ref in (f"runs:/{ids['b']}/program", "models:/nemori-tuned/1"):
        assert _run(tmp_path, "--system", "nemori", "--no-judge", "--out", str(tmp_path / "c"),
                    "--program", ref) == 0
        assert "reused memory built by an earlier run" in capsys.readouterr().out
    mlflow.set_tracking_uri(uri)
    params = {r: mlflow.get_run(i).data.params for r, i in ids.items()}
    assert params["a"]["prompt_version.narrate"] == "1" and params["b"]["prompt_version.narrate"] == "2"
    assert params["a"]["prompt_version.answer"] == params["b"]["prompt_version.answer"] == "1"
    assert main(["report", "--run-id", ids["a"], "--compare", ids["b"], "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert ids["a"] in text and ids["b"] in text and "prompts that differ: narrate" in text
    f1 = next(line for line in text.splitlines() if line.startswith("nemori f1 ") and "overall" in line)
    assert f1.count("[") == 2 and f1.count("n=3") == 2  # both runs, with CIs
    assert "## Construction cost per stage, A" in text and "## Construction cost per stage, B" in text
    narrate = [line for line in text.splitlines() if line.startswith("narrate ")]
    assert len(narrate) == 3 and narrate[-1].split()[-1] == "DIFFERS"  # cost rows of A and B, then the prompt row


_HEAVY = ("dspy", "litellm", "torch", "mlflow", "sentence_transformers", "onnxruntime", "nltk", "pydantic_settings")


@pytest.mark.parametrize("argv", [["--help"], ["eval", "locomo", "--help"], ["optimize", "--help"],
                                  ["serve", "http", "--help"], ["search", "--help"], ["--version"], ["status", "--help"],
                                  ["eval", "locomo", "--max-questions", "0"], ["no-such-command"]])
def test_help_and_argument_errors_import_no_heavy_library(argv):
    """``--help`` and argument errors stay fast: a fresh interpreter runs ``main(argv)`` and then lists which of
    dspy, litellm, torch, mlflow, sentence-transformers, onnxruntime, nltk and pydantic-settings (the settings
    flags' help comes from ``setting_flags.json``) it imported (none may be)."""
    import subprocess
    import sys

    code = ("import sys\nfrom nemori_dspy.apps.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    code = e.code\nprint('LOADED=' + ','.join(m for m in %r if m in sys.modules))" % (_HEAVY,))
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    loaded = [line for line in done.stdout.splitlines() if line.startswith("LOADED=")]
    assert loaded == ["LOADED="], done.stderr[-2000:]


def test_the_settings_flags_file_is_what_the_settings_model_gives():
    """``setting_flags.json`` (help and type of every settings flag, read by ``--help``) is regenerated whenever a
    settings field changes. Fix when this fails: ``python -m nemori_dspy.apps.cli.options``."""
    from nemori_dspy.apps.cli.options import SETTING_FLAGS_FILE, live_setting_flags, setting_type

    assert json.loads(SETTING_FLAGS_FILE.read_text(encoding="utf-8")) == live_setting_flags()
    assert list(setting_type("distillation").choices) == ["prediction_error", "direct"]
    assert setting_type("window_size").name == "integer"


def test_no_judge_run_says_so_instead_of_naming_a_judge(tmp_path, scripted_runtime, capsys):
    assert _run(tmp_path, "--system", "no-memory", "--no-judge") == 0
    out = capsys.readouterr().out
    assert "(no judge) ready in" in out and "(judge " not in out


def test_an_answer_that_never_parses_is_scored_empty_and_the_run_goes_on(tmp_path, monkeypatch, mlflow_db, capsys):
    """The README main job once ended at question 3 of 20 on one cut-off answer: a failed answer must be
    recorded (empty, with its error) and counted, and the other questions answered."""
    responders = default_responders()
    first: list[str] = []

    def answer(i):  # every try at the first question fails to parse; the others are answered
        first.append(first[0] if first else i["question"])
        return "no fields at all" if i["question"] == first[0] else chat_reply(answer="7 May 2023")

    responders["AnswerQuestion"] = answer
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(responders))
    assert _run(tmp_path, "--system", "no-memory", "--no-judge") == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    failed = [r for r in rows if "answer_error" in r]
    assert len(rows) == 3 and len(failed) == 1 and failed[0]["answer"] == "" and failed[0]["f1"] == 0
    assert "ANSWERS FAILED 1" in capsys.readouterr().out


def test_failed_answers_are_reported_when_memory_is_reused(tmp_path, monkeypatch, mlflow_db, capsys):
    responders = default_responders()
    responders["AnswerQuestion"] = lambda i: "no fields at all"
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(default_responders()))
    assert _run(tmp_path, "--system", "nemori", "--no-judge") == 0  # builds the memory
    install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(responders))
    assert _run(tmp_path, "--system", "nemori", "--no-judge", "--out", str(tmp_path / "again"), "--no-cache") == 0
    out = capsys.readouterr().out.split("run folder")[-1]
    assert "memory reused" in out and "ANSWERS FAILED 3" in out


@pytest.mark.parametrize("command", [
    ["eval", "locomo", "--data", str(SYNTHETIC_MINI)],
    ["optimize", "--stage", "narrate", "--data", str(SYNTHETIC_MINI.parent / "synthetic_locomo.json"),
     "--sessions", "1-2", "--train", "conv-a", "--dev", "conv-b", "--no-mlflow"]])
def test_a_model_program_resolves_in_the_runs_tracking_store_for_eval_and_optimize(command, monkeypatch, tmp_path,
                                                                                  capsys):
    """``--program models:/...`` is read from the MLflow store the run's settings name, under every command, and a
    program that cannot be read fails before any model is loaded."""
    import nemori_dspy.eval.model as model
    from nemori_dspy.errors import ConfigError

    seen: list[tuple[str, str | None]] = []

    def load_program(ref, tracking_uri=None):
        seen.append((ref, tracking_uri))
        raise ConfigError("no such model. Fix: register it.")

    def no_model(*a, **k):
        raise AssertionError("runtime built despite an unreadable --program")

    monkeypatch.setattr(model, "load_program", load_program)
    monkeypatch.setattr(runtime, "build_runtime", no_model)
    uri = f"sqlite:///{tmp_path}/elsewhere.db"
    assert main([*command, "--program", "models:/tuned/3", "--mlflow-tracking-uri", uri,
                 "--out", str(tmp_path / "run")]) == 2
    assert seen == [("models:/tuned/3", uri)] and "no such model" in capsys.readouterr().err


@pytest.mark.parametrize("model, expected", [
    (None, None),                                             # the embedded local models: no estimate at all
    ("openai/gpt-4o-mini", "cost estimate before the run"),   # priced by litellm: a table with dollars
    ("openai/local", "cost estimate: unpriced (openai/local"),  # an OpenAI-compatible server litellm cannot price
])
def test_a_cost_estimate_is_printed_before_a_run_with_a_priced_model(tmp_path, scripted_runtime, capsys, model,
                                                                     expected):
    extra = ["--model", model, "--api-base", "http://127.0.0.1:9/v1"] if model else []
    if model:
        scripted_runtime.model = model  # the runtime's LM is what the estimate prices
    assert _run(tmp_path, "--system", "nemori", "--no-mlflow", "--no-judge", "--max-questions", "1", *extra) == 0
    out = capsys.readouterr().out
    if expected is None:
        assert "cost estimate" not in out
        return
    assert expected in out and out.index(expected) < out.index("Construction cost per stage")
    if model == "openai/gpt-4o-mini":
        table = out[out.index(expected):out.index("Construction cost per stage")]
        assert "construction: narrate" in table and "56 turns to build, 1 answers" in table
        assert float(next(x for x in table.splitlines() if x.startswith("total")).split()[-1]) > 0
