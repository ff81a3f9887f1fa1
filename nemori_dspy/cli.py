"""Command line: ``nemori-dspy eval locomo --data PATH [options]``, ``nemori-dspy eval longmemeval --data PATH``,
``nemori-dspy optimize ...``, ``nemori-dspy report``.

Options override ``NemoriSettings`` (which also reads ``NEMORI_*`` env vars); the settings
then flow one way into ``build_runtime`` → ``dspy.configure``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main", "build_parser", "resolve_dataset"]

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376/data/locomo10.json"

#: CLI flag → settings field, for flags that map one-to-one.
_SETTING_FLAGS = ("model", "api_base", "gguf", "models_dir", "local_model_size", "embedder", "embedder_path",
                  "judge_model", "window_size", "adapter", "mlflow_tracking_uri", "mlflow_experiment",
                  "distillation", "n_threads", "n_ctx")
#: settings flags of the judged evals only (``eval locomo``, ``eval longmemeval``).
_JUDGE_FLAGS = ("judge_audit",)
_JUDGE_SETTINGS = (*_JUDGE_FLAGS, "judge_prompt")  # --judge sets judge_prompt


def _setting_help(name: str) -> str:
    """``--help`` text of a settings flag: the field's description, default and env var."""
    from .config import NemoriSettings

    field = NemoriSettings.model_fields[name]
    choices = getattr(field.annotation, "__args__", None) if "Literal" in str(field.annotation) else None
    allowed = f"one of {', '.join(map(str, choices))}; " if choices else ""
    return f"{field.description or name} ({allowed}default: {field.default}; env NEMORI_{name.upper()})"


def _positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (0 would silently run nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1; give 1 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: ``eval locomo``, ``eval longmemeval``, ``optimize``, ``report``."""
    p = argparse.ArgumentParser(prog="nemori-dspy", description="Nemori long-term memory as a DSPy pipeline")
    sub = p.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="run a benchmark").add_subparsers(dest="benchmark", required=True)
    lo = ev.add_parser("locomo", help="LoCoMo QA: build memory per conversation, answer, score, log to MLflow")
    lo.add_argument("--data", help="locomo10.json or a file in its schema (default: $NEMORI_LOCOMO_PATH, "
                                   "else download the upstream file into $NEMORI_CACHE_DIR, default ~/.cache/nemori-dspy)")
    lo.add_argument("--conversations", help="comma-separated sample ids, e.g. conv-26,conv-30 (default: all)")
    lo.add_argument("--max-questions", type=_positive_int, help="cap on questions per conversation (categories 1-4), "
                                                                "stratified by category (round-robin, in question order)")
    lo.add_argument("--sessions", help="a LoCoMo slice: keep sessions A-B of each conversation (e.g. 1-3) and only "
                                       "the questions whose evidence lies inside them (default: all sessions)")
    lo.add_argument("--slice", help=_SLICE_HELP + "; replaces --conversations and --sessions")
    lo.add_argument("--system", default="nemori,no-memory",
                    help="comma-separated systems: nemori, nemori-paper (the paper's configuration, every addition "
                         "of ours off: PAPER_FAITHFUL), nemori-s, nemori-no-episodic, nemori-no-semantic, "
                         "nemori-no-raw, nemori-no-consolidation, nemori-flat, full-context, rag-4096, no-memory "
                         "(default nemori,no-memory: the method and its no-memory control)")
    lo.add_argument("--resume", action="store_true", help="continue the run in --out (default: the latest "
                                                          "runs/locomo-*) without redoing answered questions")
    lo.add_argument("--concurrency", type=_positive_int, default=1, help="conversations whose memory is built at once")
    _program_and_tracking_flags(lo)
    lo.add_argument("--out", help="run folder (default runs/locomo-<time>)")
    lo.add_argument("--db", help="SQLite store file to build into (default: a store under ~/.cache/nemori-dspy/"
                                 "memory/ keyed by everything that shapes memory, reused by later runs)")
    _cache_log_and_setting_flags(lo)
    lo.add_argument("--judge", dest="judge_prompt", choices=["generous", "strict", "both"], default=None,
                    help=_setting_help("judge_prompt"))
    _longmemeval_parser(ev)
    _optimize_parser(sub)
    rp = sub.add_parser("report", help="print the side-by-side table of a finished run from MLflow")
    rp.add_argument("--run-id", help="parent run id (default: the latest run of the experiment)")
    rp.add_argument("--compare", help="a second run id (eval or optimize run) shown side by side with --run-id: "
                                      "scores per category with 95%% CI, paired differences (bootstrap CI, McNemar p), "
                                      "construction cost per stage, prompts that differ")
    rp.add_argument("--tracking-uri", help="default: $NEMORI_MLFLOW_TRACKING_URI, $MLFLOW_TRACKING_URI or "
                                           "sqlite:///mlruns.db (the store eval logs to)")
    rp.add_argument("--experiment", help="default: $NEMORI_MLFLOW_EXPERIMENT or nemori-dspy")
    from . import cli_serve

    cli_serve.add_parsers(sub)  # serve http|mcp|token, add, search, answer, list, delete, export, import
    return p


def _program_and_tracking_flags(p: Any) -> None:
    """Flags every eval shares: the program to run, model registration, judge and MLflow off switches."""
    p.add_argument("--program", help="a saved pipeline state to run (e.g. optimized prompts/demos): a program.json, "
                                       "runs:/<run_id>/program or models:/<name>/<version> (an eval's logged model)")
    p.add_argument("--register-model", help="also register the program that ran as an MLflow model under this name")
    p.add_argument("--no-judge", action="store_true", help="skip the LLM judge")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")


def _cache_log_and_setting_flags(p: Any) -> None:
    """Flags every eval shares: DSPy cache off, INFO logging, and one flag per setting of ``_SETTING_FLAGS`` and
    ``_JUDGE_FLAGS``."""
    p.add_argument("--no-cache", action="store_true", help="disable DSPy's response cache")
    p.add_argument("-v", "--verbose", action="store_true", help="log INFO (resolved config, repairs, retries)")
    for name in (*_SETTING_FLAGS, *_JUDGE_FLAGS):
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=_setting_help(name))


def _longmemeval_parser(ev: Any) -> None:
    """``eval longmemeval``: one memory per question, the per-type LongMemEval judges (``eval/longmemeval_runner.py``)."""
    lm = ev.add_parser("longmemeval", help="LongMemEval QA: build one memory per question, answer, judge per "
                                           "question type, log to MLflow")
    lm.add_argument("--data", required=True, help="longmemeval_s_cleaned.json or a file in its schema (a JSON list "
                                                  "of questions; https://huggingface.co/datasets/xiaowu0162/"
                                                  "longmemeval-cleaned)")
    lm.add_argument("--questions", help="comma-separated question ids (default: all, in file order)")
    lm.add_argument("--question-types", help="comma-separated question types, e.g. temporal-reasoning,"
                                             "knowledge-update (default: all)")
    lm.add_argument("--max-questions", type=_positive_int, help="cap on questions in all (after the filters)")
    lm.add_argument("--system", default="nemori,no-memory", help="comma-separated systems, as for eval locomo")
    lm.add_argument("--resume", action="store_true", help="continue the run in --out (default: the latest "
                                                          "runs/longmemeval-*) without redoing answered questions")
    lm.add_argument("--concurrency", type=_positive_int, default=1, help="questions whose memory is built at once")
    _program_and_tracking_flags(lm)
    lm.add_argument("--out", help="run folder (default runs/longmemeval-<time>)")
    lm.add_argument("--db", help="SQLite store file to build into (default: a reused store under "
                                 "~/.cache/nemori-dspy/memory/, as for eval locomo)")
    _cache_log_and_setting_flags(lm)


def _optimize_parser(sub: Any) -> None:
    """``optimize``: tune stages against a LoCoMo slice (``optimizers/tune.py``)."""
    from .optimizers.names import OPTIMIZERS  # a constant: no dspy, no metrics module

    op = sub.add_parser("optimize", help="tune stage prompts with a DSPy optimizer on a LoCoMo slice; dev before/after")
    op.add_argument("--stage", required=True, help="stage(s), comma-separated, tuned in pipeline order: narrate, "
                                                   "anticipate, distill, anticipate+distill, consolidate, answer")
    op.add_argument("--optimizer", default="gepa", choices=OPTIMIZERS, help="DSPy optimizer (default gepa)")
    op.add_argument("--data", help="locomo10.json or a file in its schema (as for eval locomo)")
    op.add_argument("--sessions", default="1-3", help="LoCoMo slice A-B (default 1-3)")
    op.add_argument("--slice", help=_SLICE_HELP + "; replaces --sessions, and --train/--dev default to its "
                                                  "conversations not in --test but the last / the last (a "
                                                  "one-conversation slice is dev: give --train)")
    op.add_argument("--train", help="train conversations, e.g. conv-26,conv-30 (required without --slice)")
    op.add_argument("--dev", help="dev conversations the optimizer selects on, e.g. conv-41 (never in --train; "
                                  "required without --slice); its after-score is optimistic: --test is held out")
    op.add_argument("--test", help="test conversations, scored before and after and never selected on (in neither "
                                   "--train nor --dev), e.g. conv-42,conv-43: the held-out estimate")
    op.add_argument("--answer-metric", default="judge+f1", choices=["judge+f1", "judge", "f1"],
                    help="the answer stage's metric: judge+f1 (default; mean of the LLM judge's verdict and token "
                         "F1), judge, or f1 alone (rewards brevity); the judge is --reflection-model, audited first")
    op.add_argument("--out", help="run folder (default runs/optimize-<time>): program.json, result.json")
    op.add_argument("--auto", choices=["light", "medium", "heavy"], help="MIPROv2/GEPA/SIMBA budget preset")
    op.add_argument("--max-metric-calls", type=_positive_int, help="GEPA: metric calls in all")
    op.add_argument("--num-trials", type=_positive_int, help="MIPROv2 trials (auto off) / SIMBA steps")
    op.add_argument("--num-candidates", type=_positive_int, help="MIPROv2 candidates when --num-trials is given")
    op.add_argument("--max-train", type=_positive_int, help="keep at most N train examples (seeded sample; "
                                                           "dev is always whole)")
    op.add_argument("--num-threads", type=_positive_int, default=1, help="parallel program calls (default 1)")
    op.add_argument("--max-demos", type=int, default=4, help="bootstrapped and labeled demos per predictor (default 4)")
    op.add_argument("--reflection-model", default="local:1.5b",
                    help="prompt/reflection/teacher model: local:0.5b, local:1.5b (default; a second embedded "
                         "server), a litellm model string, or 'none' for the student itself")
    op.add_argument("--metric", default="stage", choices=["stage", "end-to-end"],
                    help="stage: the stage's own LLM-free metric on recorded calls (minutes); end-to-end: rebuild "
                         "each conversation's memory per candidate and score its answers' F1 (hours)")
    op.add_argument("--program", help="start from a saved pipeline state instead of the default prompts")
    op.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    op.add_argument("--no-cache", action="store_true", help="disable DSPy's response cache")
    op.add_argument("-v", "--verbose", action="store_true", help="log INFO (optimizer progress, repairs, retries)")
    for name in _SETTING_FLAGS:
        if name != "judge_model":
            op.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=_setting_help(name))


def resolve_dataset(path: str | None, settings: Any = None) -> Path:
    """--data, else ``settings.locomo_path`` ($NEMORI_LOCOMO_PATH or .env), else the upstream
    locomo10.json downloaded once into ``settings.cache_dir``.

    The dataset is CC BY-NC 4.0: it is read from a path or fetched at run time, never shipped.

    Raises:
        DatasetError: the download failed (no path given and no network).
    """
    from .config import NemoriSettings
    from .errors import DatasetError

    settings = settings or NemoriSettings()
    chosen = path or settings.locomo_path
    if chosen:
        return Path(chosen)
    target = Path(settings.cache_dir) / "locomo10.json"
    if not target.exists():
        import httpx

        try:
            r = httpx.get(LOCOMO_URL, timeout=60, follow_redirects=True)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise DatasetError(f"could not download LoCoMo from {LOCOMO_URL}: {exc}. Fix: pass --data "
                               "path/to/locomo10.json or set NEMORI_LOCOMO_PATH.") from exc
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(r.content)
    return target


def _settings(args: argparse.Namespace) -> Any:
    from .config import load_settings

    overrides = {k: getattr(args, k) for k in (*_SETTING_FLAGS, *_JUDGE_SETTINGS) if getattr(args, k, None) is not None}
    if args.no_cache:
        overrides["cache"] = False
    return load_settings(**overrides)


def _run_dir(args: argparse.Namespace, kind: str = "locomo") -> Path:
    if args.out:
        return Path(args.out)
    if getattr(args, "resume", False):  # the newest run that got as far as answering (a failed start: empty folder)
        runs = sorted(p for p in Path("runs").glob(f"{kind}-*") if (p / "results.jsonl").exists())
        if runs:
            return runs[-1]
    return Path(f"runs/{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


#: ``--slice`` help, shared by eval locomo and optimize (the slices: ``eval.locomo.NAMED_SLICES``).
_SLICE_HELP = ("a named LoCoMo slice: 'memory' = conv-49, all sessions (509 turns in 25 sessions, so top-10 must "
               "choose among >= 25 episodes; 156 scored questions in all four categories)")


def _named_slice(args: argparse.Namespace) -> tuple[list[str], Any]:
    """(conversation ids, SessionSlice or None) of ``--slice``; it cannot be combined with --conversations or
    --sessions.

    Raises:
        DatasetError: an unknown slice name, or --slice given with --conversations / --sessions.
    """
    from .errors import DatasetError
    from .eval.locomo import named_slice

    if getattr(args, "conversations", None) or getattr(args, "sessions", None):
        raise DatasetError(f"--slice {args.slice} names its own conversations and sessions. Fix: drop "
                           "--conversations / --sessions, or drop --slice.")
    return named_slice(args.slice)


def _ids(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def _eval_locomo(args: argparse.Namespace) -> int:
    from .eval.judge_audit import locomo_audit_pairs
    from .eval.locomo import dataset_sha256, load_locomo, parse_sessions, slice_sessions
    from .eval.runner import EvalOptions, run_locomo
    from .eval.systems import parse_systems
    from .runtime import build_runtime

    settings = _settings(args)
    logging.getLogger(__name__).info("resolved config (secrets removed): %s", settings.public_dict())
    systems = parse_systems(args.system)
    data = resolve_dataset(args.data, settings)
    sessions = parse_sessions(args.sessions)  # a bad slice fails before any model is loaded
    ids = _ids(args.conversations)
    if getattr(args, "slice", None):  # a named slice (eval.locomo.NAMED_SLICES): its conversations and sessions
        ids, sessions = _named_slice(args)
    conversations = [slice_sessions(c, sessions) for c in load_locomo(data, ids)]
    data_sha = dataset_sha256(data)
    program = _program_state(args.program, settings)  # a bad --program fails before any model is loaded
    out = _run_dir(args)  # created by the run itself, once the model is up (no empty folders from failed starts)
    print(f"dataset {data} ({len(conversations)} conversation(s)); systems {', '.join(s.name for s in systems)}; "
          f"run folder {out}", flush=True)
    t0 = time.perf_counter()
    tracker = _tracker(args, settings, out, [s.name for s in systems])
    with tracker or contextlib.nullcontext():
        with build_runtime(settings) as rt:
            print(_ready_line(rt, args, t0), flush=True)
            provider, embedder_name = _memory_provider(args, settings, rt, data_sha, program,
                                                       sessions.label() if sessions else None)
            pipeline = provider.memory(systems[0]).pipeline
            _start_tracker(tracker, settings, pipeline, {
                "dataset.path": str(data), "dataset.sha256": data_sha,
                "dataset.conversations": ",".join(c.sample_id for c in conversations),
                "max_questions": args.max_questions, "model_label": rt.model_label, "embedder": embedder_name,
                "sessions": sessions.label() if sessions else "all", "program": args.program,
                "server": _flags(rt.server), "judge_server": _flags(rt.judge_server)})
            opts = EvalOptions(systems=systems, max_questions=args.max_questions, resume=args.resume,
                               concurrency=args.concurrency, **_observer(tracker))
            judge = None if args.no_judge else _locomo_judges(settings, rt, locomo_audit_pairs(
                conversations, opts.categories, opts.max_questions, settings.judge_audit))
            with tracker.tracing() if tracker else contextlib.nullcontext():
                summary = run_locomo(provider, conversations, opts, judge, out)
            pipeline.save(str(out / "program.json"))
        _print_summary(summary, time.perf_counter() - t0, local=settings.model == "local")
        _finish_tracker(tracker, settings, summary, pipeline, args.register_model)
    return 0


def _flags(server: Any) -> dict[str, Any]:
    """A model server's flags without its port (which changes per run)."""
    return {k: v for k, v in (server.flags if server else {}).items() if k != "port"}


def _tracker(args: argparse.Namespace, settings: Any, out: Path, systems: list[str]) -> Any:
    """The live MLflow record of this eval (``eval.tracking.EvalTracker``), or None with ``--no-mlflow``."""
    if args.no_mlflow:
        return None
    from .eval.tracking import EvalTracker

    return EvalTracker(settings, out, systems, out.name, resume=args.resume)


def _observer(tracker: Any) -> dict[str, Any]:
    return {"observer": tracker} if tracker is not None else {}


def _start_tracker(tracker: Any, settings: Any, pipeline: Any, params: dict[str, Any]) -> None:
    """Open the MLflow runs now (params, the prompts that run) and say where to watch them."""
    if tracker is None:
        return
    from .eval.tracking import stage_prompts, tracking_uri

    run_id = tracker.start(params, stage_prompts(pipeline))
    state = "resumed" if tracker.resumed else "started"
    print(f"MLflow run {run_id} {state} at {tracking_uri(settings)}: answers and traces are logged as they come "
          f"(watch: mlflow ui --backend-store-uri {tracking_uri(settings)})", flush=True)


def _finish_tracker(tracker: Any, settings: Any, summary: dict[str, Any], pipeline: Any,
                    register_model: str | None) -> None:
    """Final metrics, artifacts and the program model into the live runs; they end FINISHED."""
    if tracker is None:
        return
    from .eval.model import program_state
    from .eval.tracking import tracking_uri

    run_id = tracker.finish(summary, program_state(pipeline), register_model)
    registered = f"; registered as model {register_model!r}" if register_model else ""
    print(f"MLflow run {run_id} at {tracking_uri(settings)}; program model runs:/{run_id}/program{registered} "
          f"(view: mlflow ui --backend-store-uri {tracking_uri(settings)}; or: nemori-dspy report --run-id {run_id})")


def _eval_longmemeval(args: argparse.Namespace) -> int:
    from .eval.judge import JudgePanel
    from .eval.judge_audit import longmemeval_audit_pairs
    from .eval.locomo import dataset_sha256
    from .eval.longmemeval import load_longmemeval
    from .eval.longmemeval_judge import LongMemEvalJudge
    from .eval.longmemeval_runner import run_longmemeval
    from .eval.runner import EvalOptions
    from .eval.systems import parse_systems
    from .runtime import build_runtime

    settings = _settings(args)
    systems = parse_systems(args.system)
    questions = load_longmemeval(args.data, _ids(args.questions), _ids(args.question_types))[: args.max_questions]
    data_sha = dataset_sha256(args.data)
    program = _program_state(args.program, settings)  # a bad --program fails before any model is loaded
    out = _run_dir(args, "longmemeval")
    print(f"dataset {args.data} ({len(questions)} question(s), one memory each); systems "
          f"{', '.join(s.name for s in systems)}; run folder {out}", flush=True)
    t0 = time.perf_counter()
    tracker = _tracker(args, settings, out, [s.name for s in systems])
    with tracker or contextlib.nullcontext():
        with build_runtime(settings) as rt:
            print(_ready_line(rt, args, t0), flush=True)
            provider, embedder_name = _memory_provider(args, settings, rt, data_sha, program)
            pipeline = provider.memory(systems[0]).pipeline
            _start_tracker(tracker, settings, pipeline, {
                "benchmark": "longmemeval", "dataset.path": str(args.data), "dataset.sha256": data_sha,
                "dataset.questions": len(questions), "question_types": args.question_types or "all",
                "max_questions": args.max_questions, "model_label": rt.model_label, "embedder": embedder_name,
                "program": args.program, "server": _flags(rt.server)})
            judge = None if args.no_judge else JudgePanel(
                {"judge": LongMemEvalJudge(rt.judge_lm, parse_retries=settings.parse_retries,
                                           model_label=rt.judge_label)},
                longmemeval_audit_pairs(questions, settings.judge_audit))
            opts = EvalOptions(systems=systems, resume=args.resume, concurrency=args.concurrency, **_observer(tracker))
            with tracker.tracing() if tracker else contextlib.nullcontext():
                summary = run_longmemeval(provider, questions, opts, judge, out)
            pipeline.save(str(out / "program.json"))
        _print_summary(summary, time.perf_counter() - t0, local=settings.model == "local")
        _finish_tracker(tracker, settings, summary, pipeline, args.register_model)
    return 0


def _memory_provider(args: argparse.Namespace, settings: Any, rt: Any, data_sha: str,
                     program: dict[str, Any] | None, sessions: str | None = None) -> tuple[Any, str]:
    """(memory provider, embedder name) for ``eval`` and ``optimize``: ``--db`` → one shared store (stage records
    beside it), else stores reused by construction key (settings, model, program, dataset, LoCoMo slice)."""
    from .embedders import resolve_embedder
    from .eval.cache import CachedMemories, construction_key
    from .eval.model import apply_program
    from .eval.runner import SharedMemory
    from .memory import Memory
    from .modules.pipeline import NemoriPipeline, stage_factory
    from .modules.resources import Resources
    from .store import open_store

    embedder = resolve_embedder(settings)

    def make_memory(s: Any, path: Path) -> Memory:
        store = open_store(s, path)
        pipeline = NemoriPipeline(Resources(store, embedder, s), stage_factory(s, rt.stage_lms))
        if program:
            apply_program(pipeline, program)
        return Memory(store, embedder, s, pipeline=pipeline)

    if getattr(args, "db", None):
        return SharedMemory(make_memory(settings, Path(args.db)), Path(args.db + ".stages.jsonl")), embedder.name

    def key_of(s: Any) -> str:
        return construction_key(s, rt.model_label, embedder.name, data_sha, program, sessions)

    return CachedMemories(settings, make_memory, key_of, settings.cache_dir), embedder.name


def _locomo_judges(settings: Any, rt: Any, audit: list[Any]) -> Any:
    """The LoCoMo judge panel (``eval.judge.JudgePanel``) on the runtime's judge LM: the prompt(s)
    ``settings.judge_prompt`` names (``judge``, ``judge_strict``), with its calibration set."""
    from .eval.judge import JUDGE_METRICS, JudgePanel, LLMJudge

    return JudgePanel({name: LLMJudge(rt.judge_lm, max_tokens=settings.stage_max_tokens("judge"),
                                      parse_retries=settings.parse_retries, model_label=rt.judge_label,
                                      strict=name == "judge_strict")
                       for name in JUDGE_METRICS[settings.judge_prompt]}, audit)


def _ready_line(rt: Any, args: argparse.Namespace, t0: float) -> str:
    """``model X (judge Y; memory written by Z) ready in Ns``; ``no judge`` with ``--no-judge``, which loads none;
    the memory part only when stages run on another model (``local_memory_model``, ``stage_lms``)."""
    parts = ["no judge" if args.no_judge else f"judge {rt.judge_label}"]
    if rt.stage_lms:
        from nemori_dspy.config import MEMORY_WRITING_STAGES

        size = rt.settings.local_memory_model
        local = bool(size) and rt.settings.model == "local"
        label = f"local:{size}" if local else ", ".join(sorted({getattr(lm, "model", "?") for lm in rt.stage_lms.values()}))
        stages = ("memory stages (all but partition)" if set(rt.stage_lms) == set(MEMORY_WRITING_STAGES)
                  else ", ".join(sorted(rt.stage_lms)))
        parts.append(f"{stages} on {label}")
    return f"model {rt.model_label} ({'; '.join(parts)}) ready in {time.perf_counter() - t0:.1f}s"


def _program_state(ref: str | None, settings: Any = None) -> dict[str, Any] | None:
    """The saved pipeline state ``--program`` names: a ``program.json`` path, ``runs:/<run_id>/program`` or
    ``models:/<name>/<version>`` (``eval.model.load_program``); None without ``--program``."""
    if not ref:
        return None
    from .eval.model import is_model_uri, load_program

    uri = None
    if is_model_uri(ref):
        from .eval.tracking import tracking_uri

        uri = tracking_uri(settings) if settings is not None else None
    return load_program(ref, uri)


def _report(args: argparse.Namespace) -> int:
    from .eval.report import report

    from .config import load_settings
    from .eval.tracking import tracking_uri

    settings = load_settings()
    uri = args.tracking_uri or tracking_uri(settings)
    if args.compare:
        from .eval.report import compare

        print(compare(uri, args.run_id, args.compare, args.experiment or settings.mlflow_experiment))
        return 0
    print(report(uri, args.run_id, args.experiment or settings.mlflow_experiment))
    return 0


def _print_summary(summary: dict[str, Any], seconds: float, local: bool = True) -> None:
    from .eval.metrics import answer_time_table, cost_table
    from .eval.runner import CONSTRUCTION_STAGES

    print("\nConstruction cost per stage (LLM calls and tokens; Table 9 layout):")
    print(cost_table(summary["construction_usage"], CONSTRUCTION_STAGES, local=local))
    print("\nAll LLM usage per stage (construction + answering + judge), with cache hits and seconds:")
    print(summary["usage_table"])
    e = summary.get("embedding_usage")
    if e:
        price = f"${e['cost_usd']:.4f}" if e["cost_usd"] else "$0 (local or unpriced)"
        print(f"Embedding calls (apart from LLM calls): {e['calls']} calls, {e['texts']} texts, "
              f"{e['tokens']} tokens, {e['seconds']:.1f} s, {price}")
    print("\nAnswer time per system (Table 4 layout):")
    print(answer_time_table(summary["rows"], summary["systems"]))
    print("\nScores ×100 per category with 95% CI (n = questions):")
    print(summary["table"])
    if summary.get("memory"):  # issue 19: the Memory table
        from .eval.memory_quality import memory_summary_text

        print(memory_summary_text(summary))
    if summary.get("paired_table"):  # two or more systems on the same questions
        print(f"\nPaired differences vs {summary['paired']['baseline']} on the questions both answered (×100; "
              "paired bootstrap 95% CI; judge: wins/losses and exact McNemar p):")
        print(summary["paired_table"])
    for system, by_metric in (summary.get("longmemeval") or {}).items():  # upstream's summary metrics
        parts = [f"{m} task-averaged {100 * a['task_averaged']:.1f}, abstention "
                 + ("-" if a["abstention"] is None else f"{100 * a['abstention']:.1f}")
                 for m, a in by_metric.items() if a["task_averaged"] is not None]
        if parts:
            print(f"{system} (LongMemEval, ×100): " + "; ".join(parts))
    if summary.get("judge_audit"):
        from .eval.judge_audit import audit_table

        print("\nJudge audit (calibration set from the data: the gold answer must be judged CORRECT, a known-wrong "
              "answer WRONG; accuracy ×100):")
        print(audit_table(summary["judge_audit"]))
    if summary.get("stage_activity"):  # issue 19: which stages ran, which guards skipped or rewrote their work
        from .eval.stage_activity import stage_activity_table

        print("\nStage activity (construction calls per 100 turns and per episode; guards: how often and why):")
        print(stage_activity_table(activity=summary["stage_activity"]))
    for sid, cov in summary["coverage"].items():
        print(f"{sid}: {cov['messages']} turns, {cov['in_one_episode']} in exactly one episode, "
              f"{cov['in_no_episode']} in none, {cov['in_several']} in several; {cov['episodes']} episodes")
    c = summary["counters"]
    if summary["reused_memory"] and not c.get("evoke_calls") and not summary["ingest_seconds"]:
        print("construction counters: n/a here (memory reused; they are in the summary of the run that built it)")
    else:
        _print_counters(c)
    if c.get("answers_failed"):
        print(f"ANSWERS FAILED {c['answers_failed']}: the answer stage gave no usable reply after its retries "
              "(scored as empty answers; each row's answer_error says why)")
    if summary["reused_memory"]:
        print(f"reused memory built by an earlier run: {', '.join(summary['reused_memory'])}")
    if summary["resumed_answers"]:
        print(f"resumed: {summary['resumed_answers']} answers were already in results.jsonl")
    if summary["parked"]:
        print(f"PARKED work ({len(summary['parked'])}): " + "; ".join(summary["parked"][:5]))
    where = " this invocation" if summary["resumed_answers"] else ""
    print(f"total {seconds / 60:.1f} min{where} (memory construction {summary['ingest_seconds'] / 60:.1f} min"
          f"{' over the whole run' if where else ''})")


def _print_counters(c: dict[str, int]) -> None:
    print(f"evoked context empty {c.get('evoke_empty', 0)}/{c.get('evoke_calls', 0)} times (τ on cosine); "
          f"insights {c.get('insights', 0)}, duplicates of an existing entry {c.get('insight_duplicates', 0)}; "
          f"partition repairs {c.get('partition_repairs', 0)}; retries {c.get('retries', 0)}; "
          f"episode merges {c.get('episode_merges', 0)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nemori-dspy`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the embedded model server and open runs are closed cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if hasattr(signal, "SIGHUP"):  # a closed terminal: the same clean end (an eval's MLflow run ends KILLED)
        signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .errors import NemoriError

    try:
        if args.command == "eval" and args.benchmark == "locomo":
            return _eval_locomo(args)
        if args.command == "eval" and args.benchmark == "longmemeval":
            return _eval_longmemeval(args)
        if args.command == "report":
            return _report(args)
        if args.command == "optimize":
            from .optimizers.cli import optimize_command

            return optimize_command(args)
        from . import cli_serve

        handled = cli_serve.dispatch(args)
        if handled is not None:
            return handled
    except NemoriError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
