"""``nemori-dspy eval locomo``, ``eval longmemeval`` and ``report``: build memory, answer, score, log to MLflow,
and print a finished run's table.

Each eval builds its run through ``apps.context.RunContext``: settings from the flags, the program
(``--program``), then the runtime and the memory provider; bad input fails before any model is loaded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from nemori_dspy.apps.cli.options import (EVAL_SETTINGS, POSITIVE_INT, SLICE_HELP, compose, configure_logging,
                                          data_option, db_option, no_cache_option, out_option, program_and_tracking_options,
                                          setting_options, verbose_option)
from nemori_dspy.apps.context import RunContext, locomo_judges, resolve_dataset, run_dir, split_ids, stage_models

if TYPE_CHECKING:  # pragma: no cover - the eval (pydantic) is imported when a command runs, not for --help
    from nemori_dspy.eval.summary import RunResult

__all__ = ["eval_group", "report", "named_slice_ids", "print_summary"]

_SYSTEM_HELP = ("comma-separated systems: nemori, nemori-paper (the paper's configuration, every addition "
                "of ours off: PAPER_FAITHFUL), nemori-s, nemori-no-episodic, nemori-no-semantic, "
                "nemori-no-raw, nemori-no-consolidation, nemori-flat, full-context, rag-4096, no-memory "
                "(default nemori,no-memory: the method and its no-memory control)")


def _eval_options(kind: str, db_help: str, concurrency_help: str) -> Any:
    """The options every eval shares, after its own: program and tracking, ``--out``, ``--db``, cache, ``-v``
    and the settings flags."""
    return compose(
        click.option("--resume", is_flag=True, help=f"continue the run in --out (default: the latest runs/{kind}-*) "
                                                    "without redoing answered questions"),
        click.option("--concurrency", type=POSITIVE_INT, default=1, help=concurrency_help),
        program_and_tracking_options(),
        out_option(f"run folder (default runs/{kind}-<time>)"),
        db_option(db_help),
        no_cache_option(),
        verbose_option(),
        setting_options(EVAL_SETTINGS))


@click.group("eval", help="run a benchmark")
def eval_group() -> None:
    """``eval``: the benchmarks (``locomo``, ``longmemeval``)."""


def named_slice_ids(slice_name: str, conversations: str | None, sessions: str | None) -> tuple[list[str], Any]:
    """(conversation ids, SessionSlice or None) of ``--slice``; it cannot be combined with --conversations or
    --sessions.

    Raises:
        DatasetError: an unknown slice name, or --slice given with --conversations / --sessions.
    """
    from nemori_dspy.errors import DatasetError
    from nemori_dspy.eval.locomo import named_slice

    if conversations or sessions:
        raise DatasetError(f"--slice {slice_name} names its own conversations and sessions. Fix: drop "
                           "--conversations / --sessions, or drop --slice.")
    return named_slice(slice_name)


@eval_group.command("locomo", help="LoCoMo QA: build memory per conversation, answer, score, log to MLflow")
@data_option("locomo10.json or a file in its schema (default: $NEMORI_LOCOMO_PATH, else download the upstream "
             "file into $NEMORI_CACHE_DIR, default ~/.cache/nemori-dspy)")
@click.option("--conversations", default=None, help="comma-separated sample ids, e.g. conv-26,conv-30 (default: all)")
@click.option("--max-questions", type=POSITIVE_INT, default=None,
              help="cap on questions per conversation (categories 1-4), stratified by category (round-robin, in "
                   "question order)")
@click.option("--sessions", default=None, help="a LoCoMo slice: keep sessions A-B of each conversation (e.g. 1-3) "
                                               "and only the questions whose evidence lies inside them (default: "
                                               "all sessions)")
@click.option("--slice", "slice_name", default=None, help=SLICE_HELP + "; replaces --conversations and --sessions")
@click.option("--system", default="nemori,no-memory", help=_SYSTEM_HELP)
@click.option("--genai", is_flag=True,
              help="answer and score through mlflow.genai.evaluate: per system one evaluation in its child run over "
                   "a logged evaluation dataset of the questions, with the judges, F1, BLEU-1 and evidence recall@k "
                   "as scorers (memory is built as usual; not with --resume or --no-mlflow)")
@_eval_options("locomo", "SQLite store file to build into (default: a store under ~/.cache/nemori-dspy/memory/ "
                         "keyed by everything that shapes memory, reused by later runs)",
               "conversations whose memory is built at once, then questions answered and judged at once "
               "(threads; for a hosted model, e.g. 16)")
def eval_locomo(**flags: Any) -> int:
    """``eval locomo``: memory per conversation, answers per system, judge panel, MLflow record, summary."""
    from nemori_dspy.eval.genai import question_records, slice_input
    from nemori_dspy.eval.judge_audit import locomo_audit_pairs
    from nemori_dspy.eval.locomo import SCORED_CATEGORIES, dataset_sha256, load_locomo, parse_sessions, slice_sessions
    from nemori_dspy.eval.runner import EvalOptions, run_locomo
    from nemori_dspy.eval.systems import parse_systems

    if flags["genai"] and (flags["resume"] or flags["no_mlflow"]):
        from nemori_dspy.errors import ConfigError

        raise ConfigError("--genai runs every question in one MLflow evaluation per system: it needs MLflow and "
                          "cannot resume. Fix: drop --resume / --no-mlflow, or drop --genai.")
    ctx = RunContext.from_flags(flags, EVAL_SETTINGS)
    settings = ctx.settings
    logging.getLogger(__name__).info("resolved config (secrets removed): %s", settings.public_dict())
    systems = parse_systems(flags["system"])
    data = resolve_dataset(flags["data"], settings)
    sessions = parse_sessions(flags["sessions"])  # a bad slice fails before any model is loaded
    ids = split_ids(flags["conversations"])
    if flags["slice_name"]:  # a named slice (eval.locomo.NAMED_SLICES): its conversations and sessions
        ids, sessions = named_slice_ids(flags["slice_name"], flags["conversations"], flags["sessions"])
    conversations = [slice_sessions(c, sessions) for c in load_locomo(data, ids)]
    data_sha = dataset_sha256(data)
    program = ctx.program(flags["program"])  # a bad --program fails before any model is loaded
    out = run_dir(flags["out"], "locomo", flags["resume"])  # created by the run itself, once the model is up
    print(f"dataset {data} ({len(conversations)} conversation(s)); systems {', '.join(s.name for s in systems)}; "
          f"run folder {out}", flush=True)

    def params(rt: Any, embedder_name: str) -> dict[str, Any]:
        return {"dataset.path": str(data), "dataset.sha256": data_sha,
                "dataset.conversations": ",".join(c.sample_id for c in conversations),
                "max_questions": flags["max_questions"], "model_label": rt.model_label, "embedder": embedder_name,
                "sessions": sessions.label() if sessions else "all",
                "program": ",".join(flags["program"]) or None,
                "concurrency": flags["concurrency"],
                "server": _flags(rt.server), "judge_server": _flags(rt.judge_server)}

    records = question_records(conversations, SCORED_CATEGORIES, flags["max_questions"])
    name = _slice_name("locomo", flags["slice_name"] or ",".join(c.sample_id for c in conversations),
                       sessions and f"sessions {sessions.label()}",
                       flags["max_questions"] and f"max {flags['max_questions']}/conversation")

    def prepare(rt: Any, provider: Any, observer: dict[str, Any]) -> Callable[[], RunResult]:
        opts = EvalOptions(systems=systems, max_questions=flags["max_questions"], resume=flags["resume"],
                           concurrency=flags["concurrency"], **observer)
        judge = None if flags["no_judge"] else locomo_judges(settings, rt, locomo_audit_pairs(
            conversations, opts.categories, opts.max_questions, settings.judge_audit))
        _print_estimate(rt, provider, conversations, opts, judge, out)
        tracker = _note_judges(observer, judge)
        if flags["genai"]:
            from nemori_dspy.eval.genai import evaluate_locomo

            return lambda: evaluate_locomo(provider, conversations, opts, judge, out, tracker.children,
                                           "nemori-dspy-locomo", tracker.experiment_id)
        return lambda: run_locomo(provider, conversations, opts, judge, out)

    return _run_benchmark(ctx, flags, systems, out, (data_sha, program, sessions.label() if sessions else None),
                          params, prepare, lambda: slice_input(records, name, data))


@eval_group.command("longmemeval", help="LongMemEval QA: build one memory per question, answer, judge per "
                                        "question type, log to MLflow")
@data_option("longmemeval_s_cleaned.json or a file in its schema (a JSON list of questions; "
             "https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned)", required=True)
@click.option("--questions", default=None, help="comma-separated question ids (default: all, in file order)")
@click.option("--question-types", default=None, help="comma-separated question types, e.g. temporal-reasoning,"
                                                     "knowledge-update (default: all)")
@click.option("--max-questions", type=POSITIVE_INT, default=None, help="cap on questions in all (after the filters)")
@click.option("--system", default="nemori,no-memory", help="comma-separated systems, as for eval locomo")
@_eval_options("longmemeval", "SQLite store file to build into (default: a reused store under "
                              "~/.cache/nemori-dspy/memory/, as for eval locomo)",
               "questions whose memory is built at once, then answered and judged at once (threads)")
def eval_longmemeval(**flags: Any) -> int:
    """``eval longmemeval``: one memory per question, the per-type LongMemEval judges
    (``eval/longmemeval_runner.py``)."""
    from nemori_dspy.eval.judge import JudgePanel
    from nemori_dspy.eval.judge_audit import longmemeval_audit_pairs
    from nemori_dspy.eval.locomo import dataset_sha256
    from nemori_dspy.eval.longmemeval import load_longmemeval
    from nemori_dspy.eval.longmemeval_judge import LongMemEvalJudge
    from nemori_dspy.eval.longmemeval_runner import run_longmemeval
    from nemori_dspy.eval.runner import EvalOptions
    from nemori_dspy.eval.systems import parse_systems

    ctx = RunContext.from_flags(flags, EVAL_SETTINGS)
    settings = ctx.settings
    systems = parse_systems(flags["system"])
    data, max_questions = flags["data"], flags["max_questions"]
    questions = load_longmemeval(data, split_ids(flags["questions"]), split_ids(flags["question_types"]))[:max_questions]
    data_sha = dataset_sha256(data)
    program = ctx.program(flags["program"])  # a bad --program fails before any model is loaded
    out = run_dir(flags["out"], "longmemeval", flags["resume"])
    print(f"dataset {data} ({len(questions)} question(s), one memory each); systems "
          f"{', '.join(s.name for s in systems)}; run folder {out}", flush=True)

    def params(rt: Any, embedder_name: str) -> dict[str, Any]:
        return {"benchmark": "longmemeval", "dataset.path": str(data), "dataset.sha256": data_sha,
                "dataset.questions": len(questions), "question_types": flags["question_types"] or "all",
                "max_questions": max_questions, "model_label": rt.model_label, "embedder": embedder_name,
                "program": ",".join(flags["program"]) or None, "server": _flags(rt.server)}

    def prepare(rt: Any, provider: Any, observer: dict[str, Any]) -> Callable[[], RunResult]:
        judge = None if flags["no_judge"] else JudgePanel(
            {"judge": LongMemEvalJudge(rt.judge_lm, parse_retries=settings.parse_retries,
                                       model_label=rt.judge_label)},
            longmemeval_audit_pairs(questions, settings.judge_audit))
        _note_judges(observer, judge)
        opts = EvalOptions(systems=systems, resume=flags["resume"], concurrency=flags["concurrency"], **observer)
        return lambda: run_longmemeval(provider, questions, opts, judge, out)

    def dataset_input() -> Any:
        import pandas as pd

        from nemori_dspy.eval.genai import frame_input

        df = pd.DataFrame([{"question_id": q.question_id, "question_type": q.question_type, "question": q.question,
                            "answer": str(q.answer)} for q in questions])
        return frame_input(df, _slice_name("longmemeval", flags["questions"] or "all", flags["question_types"],
                                           max_questions and f"max {max_questions}"), data)

    return _run_benchmark(ctx, flags, systems, out, (data_sha, program, None), params, prepare, dataset_input)


@click.command("report", help="print the side-by-side table of a finished run from MLflow")
@click.option("--run-id", default=None, help="parent run id (default: the latest run of the experiment)")
@click.option("--compare", default=None,
              help="a second run id (eval or optimize run) shown side by side with --run-id: scores per category "
                   "with 95% CI, paired differences (bootstrap CI, McNemar p), construction cost per stage, "
                   "prompts that differ")
@click.option("--tracking-uri", default=None, help="default: $NEMORI_MLFLOW_TRACKING_URI, $MLFLOW_TRACKING_URI or "
                                                   "sqlite:///mlruns.db (the store eval logs to)")
@click.option("--experiment", default=None, help="default: $NEMORI_MLFLOW_EXPERIMENT or nemori-dspy")
def report(run_id: str | None, compare: str | None, tracking_uri: str | None, experiment: str | None) -> int:
    """``report``: one run's table, or two runs side by side with ``--compare``."""
    from nemori_dspy.eval import report as reports
    from nemori_dspy.eval.tracking import tracking_uri as settings_uri

    configure_logging(False)
    settings = RunContext.from_flags({}, ()).settings
    uri = tracking_uri or settings_uri(settings)
    if compare:
        print(reports.compare(uri, run_id, compare, experiment or settings.mlflow_experiment))
        return 0
    print(reports.report(uri, run_id, experiment or settings.mlflow_experiment))
    return 0


def _slice_name(benchmark: str, *parts: str | None) -> str:
    """The name of the run input, e.g. ``locomo conv-26; sessions 1-3; max 3/conversation``."""
    return f"{benchmark} " + "; ".join(p for p in parts if p)


def _note_judges(observer: dict[str, Any], judge: Any) -> Any:
    """Tell the tracker (if any) each judge's model: the source of its verdict assessments. Returns the tracker."""
    tracker = observer.get("observer")
    if tracker is not None and judge is not None:
        tracker.judge_models = {name: str(j.model) for name, j in judge.judges.items()}
    return tracker


def _run_benchmark(ctx: RunContext, flags: dict[str, Any], systems: list[Any], out: Path,
                   memory_key: tuple[str, Any, str | None],
                   params: Callable[[Any, str], dict[str, Any]],
                   prepare: Callable[[Any, Any, dict[str, Any]], Callable[[], RunResult]],
                   dataset: Callable[[], Any] | None = None) -> int:
    """The run both benchmarks share: the MLflow parent run, the runtime, the memory provider, the run's params,
    the benchmark itself under tracing, ``program.json``, then the summary printed and logged.

    Args:
        memory_key: (dataset sha256, start program, slice label or None) the memory provider keys stores by.
        params: (runtime, embedder name) → the MLflow params of the run.
        prepare: (runtime, provider, observer kwargs for ``EvalOptions``) → the call that runs the benchmark
            and returns its ``RunResult`` (judges and options are built before tracing starts).
        dataset: → the ``mlflow.data`` dataset of the questions that run, logged as the runs' input.
    Returns:
        0 (the command's exit status).
    """
    settings = ctx.settings
    t0 = time.perf_counter()
    tracker = _tracker(flags["no_mlflow"], flags["resume"], settings, out, [s.name for s in systems])
    with tracker or contextlib.nullcontext():
        with ctx.runtime() as rt:
            print(_ready_line(rt, flags["no_judge"], t0), flush=True)
            data_sha, program, slice_label = memory_key
            provider, embedder_name = ctx.memory_provider(rt, data_sha, program, slice_label, flags["db"])
            pipeline = provider.memory(systems[0]).pipeline
            _start_tracker(tracker, settings, pipeline, params(rt, embedder_name))
            if tracker is not None and dataset is not None:
                tracker.log_input(dataset())
            run = prepare(rt, provider, _observer(tracker))
            with tracker.tracing() if tracker else contextlib.nullcontext():
                summary = run()
            pipeline.save(str(out / "program.json"))
        print_summary(summary, time.perf_counter() - t0, local=settings.model == "local")
        _finish_tracker(tracker, settings, summary, pipeline, flags["register_model"])
    return 0


def _print_estimate(rt: Any, provider: Any, conversations: list[Any], opts: Any, judge: Any, out: Path) -> None:
    """The cost estimate of a LoCoMo run (``eval.cost_estimate``), before it starts: a table when a model it calls is
    priced, one ``unpriced`` line for a hosted model litellm cannot price, nothing for the embedded local models."""
    from nemori_dspy.eval.cost_estimate import estimate_locomo_cost
    from nemori_dspy.eval.runner import answered_keys

    done = answered_keys(out / "results.jsonl") if opts.resume else set()
    estimate = estimate_locomo_cost(conversations, opts.systems, opts.categories, opts.max_questions, rt,
                                    provider.memory(opts.systems[0]).pipeline, provider.is_built, done,
                                    judge.metrics if judge is not None else [],
                                    len(judge.audit_pairs) if judge is not None else 0)
    if estimate.priced or rt.settings.model != "local":
        print(estimate.text(), flush=True)


def _flags(server: Any) -> dict[str, Any]:
    """A model server's flags without its port (which changes per run)."""
    return {k: v for k, v in (server.flags if server else {}).items() if k != "port"}


def _tracker(no_mlflow: bool, resume: bool, settings: Any, out: Path, systems: list[str]) -> Any:
    """The live MLflow record of this eval (``eval.tracking.EvalTracker``), or None with ``--no-mlflow``."""
    if no_mlflow:
        return None
    from nemori_dspy.eval.tracking import EvalTracker

    return EvalTracker(settings, out, systems, out.name, resume=resume)


def _observer(tracker: Any) -> dict[str, Any]:
    return {"observer": tracker} if tracker is not None else {}


def _start_tracker(tracker: Any, settings: Any, pipeline: Any, params: dict[str, Any]) -> None:
    """Open the MLflow runs now (params, the prompts that run) and say where to watch them."""
    if tracker is None:
        return
    from nemori_dspy.eval.tracking import stage_prompts, tracking_uri

    run_id = tracker.start(params, stage_prompts(pipeline))
    state = "resumed" if tracker.resumed else "started"
    print(f"MLflow run {run_id} {state} at {tracking_uri(settings)}: answers and traces are logged as they come "
          f"(watch: mlflow ui --backend-store-uri {tracking_uri(settings)})", flush=True)


def _finish_tracker(tracker: Any, settings: Any, summary: RunResult, pipeline: Any,
                    register_model: str | None) -> None:
    """Final metrics, artifacts and the program model into the live runs; they end FINISHED."""
    if tracker is None:
        return
    from nemori_dspy.eval.model import program_state
    from nemori_dspy.eval.tracking import tracking_uri

    run_id = tracker.finish(summary, program_state(pipeline), register_model)
    registered = f"; registered as model {register_model!r}" if register_model else ""
    print(f"MLflow run {run_id} at {tracking_uri(settings)}; program model runs:/{run_id}/program{registered} "
          f"(view: mlflow ui --backend-store-uri {tracking_uri(settings)}; or: nemori-dspy report --run-id {run_id})")


def _ready_line(rt: Any, no_judge: bool, t0: float) -> str:
    """``model X (judge Y; memory written by Z) ready in Ns``; ``no judge`` with ``--no-judge``, which loads none;
    the memory part only when stages run on another model (``local_memory_model``, ``stage_lms``)."""
    parts = ["no judge" if no_judge else f"judge {rt.judge_label}"]
    if rt.stage_lms:
        parts.append(stage_models(rt))
    return f"model {rt.model_label} ({'; '.join(parts)}) ready in {time.perf_counter() - t0:.1f}s"




def print_summary(result: RunResult, seconds: float, local: bool = True) -> None:
    """The human summary of an eval's ``RunResult`` (``eval.runner.run_locomo`` / ``run_longmemeval``): cost and
    usage per stage, answer time, scores with CIs, memory, paired differences, judge audit, stage activity,
    coverage and counters; ``seconds`` is this invocation's wall time, ``local`` prices the cost table at $0."""
    _print_cost(result, local)
    _print_scores(result)
    _print_audit_and_activity(result)
    _print_coverage_and_counters(result)
    where = " this invocation" if result.resumed_answers else ""
    threads = f" in {result.concurrency} threads" if result.concurrency > 1 else ""
    print(f"total {seconds / 60:.1f} min{where} (memory construction {result.ingest_seconds / 60:.1f} min"
          f"{' over the whole run' if where else ''}; answering and judging {result.answer_seconds / 60:.1f} min"
          f"{threads})")


def _print_cost(result: RunResult, local: bool) -> None:
    from nemori_dspy.eval.metrics import answer_time_table, cost_table
    from nemori_dspy.eval.runner import CONSTRUCTION_STAGES

    print("\nConstruction cost per stage (LLM calls and tokens; Table 9 layout):")
    print(cost_table(result.construction_usage, CONSTRUCTION_STAGES, local=local))
    print("\nAll LLM usage per stage (construction + answering + judge), with cache hits and seconds:")
    print(result.usage_table)
    e = result.embedding_usage
    if e:
        price = f"${e.cost_usd:.4f}" if e.cost_usd else "$0 (local or unpriced)"
        print(f"Embedding calls (apart from LLM calls): {e.calls} calls, {e.texts} texts, "
              f"{e.tokens} tokens, {e.seconds:.1f} s, {price}")
    print("\nAnswer time per system (Table 4 layout):")
    print(answer_time_table(result.rows, result.systems))


def _print_scores(result: RunResult) -> None:
    print("\nScores ×100 per category with 95% CI (n = questions):")
    print(result.table)
    if result.memory:  # the Memory table
        from nemori_dspy.eval.memory_quality import memory_summary_text

        print(memory_summary_text(result.memory))
    if result.paired_table:  # two or more systems on the same questions
        print(f"\nPaired differences vs {result.paired['baseline']} on the questions both answered (×100; "
              "paired bootstrap 95% CI; judge: wins/losses and exact McNemar p):")
        print(result.paired_table)
    for system, by_metric in (result.longmemeval or {}).items():  # upstream's summary metrics
        parts = [f"{m} task-averaged {100 * a['task_averaged']:.1f}, abstention "
                 + ("-" if a["abstention"] is None else f"{100 * a['abstention']:.1f}")
                 for m, a in by_metric.items() if a["task_averaged"] is not None]
        if parts:
            print(f"{system} (LongMemEval, ×100): " + "; ".join(parts))


def _print_audit_and_activity(result: RunResult) -> None:
    if result.judge_audit:
        from nemori_dspy.eval.judge_audit import audit_table

        print("\nJudge audit (calibration set from the data: the gold answer must be judged CORRECT, a known-wrong "
              "answer WRONG; accuracy ×100):")
        print(audit_table(result.judge_audit_dicts()))
    if result.stage_activity:  # which stages ran, which guards skipped or rewrote their work
        from nemori_dspy.eval.stage_activity import stage_activity_table

        print("\nStage activity (construction calls per 100 turns and per episode; guards: how often and why):")
        print(stage_activity_table(activity=result.stage_activity))


def _print_coverage_and_counters(result: RunResult) -> None:
    for sid, cov in result.coverage.items():
        print(f"{sid}: {cov.messages} turns, {cov.in_one_episode} in exactly one episode, "
              f"{cov.in_no_episode} in none, {cov.in_several} in several; {cov.episodes} episodes")
    c = result.counters
    if result.reused_memory and not c.get("evoke_calls") and not result.ingest_seconds:
        print("construction counters: n/a here (memory reused; they are in the summary of the run that built it)")
    else:
        _print_counters(c)
    if c.get("answers_failed"):
        print(f"ANSWERS FAILED {c['answers_failed']}: the answer stage gave no usable reply after its retries "
              "(scored as empty answers; each row's answer_error says why)")
    if result.reused_memory:
        print(f"reused memory built by an earlier run: {', '.join(result.reused_memory)}")
    if c.get("answers_rate_limited"):
        print(f"RATE LIMITED {c['answers_rate_limited']} answers: the provider still refused after litellm's "
              f"retries and {c.get('answer_rate_limit_pauses', 0)} pauses; not answered, not scored. Run again with "
              "--resume (same --out) to ask them, or lower --concurrency")
    if result.resumed_answers:
        print(f"resumed: {result.resumed_answers} answers were already in results.jsonl")
    if result.parked:
        print(f"PARKED work ({len(result.parked)}): " + "; ".join(result.parked[:5]))


def _print_counters(c: dict[str, int]) -> None:
    print(f"evoked context empty {c.get('evoke_empty', 0)}/{c.get('evoke_calls', 0)} times (τ on cosine); "
          f"insights {c.get('insights', 0)}, duplicates of an existing entry {c.get('insight_duplicates', 0)}; "
          f"partition repairs {c.get('partition_repairs', 0)}; retries {c.get('retries', 0)}; "
          f"episode merges {c.get('episode_merges', 0)}")

