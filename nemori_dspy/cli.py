"""Command line: ``nemori-dspy eval locomo --data PATH [options]``.

Options override ``NemoriSettings`` (which also reads ``NEMORI_*`` env vars); the settings
then flow one way into ``build_runtime`` → ``dspy.configure``.
"""

from __future__ import annotations

import argparse
import logging
import os
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


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: ``eval locomo``."""
    p = argparse.ArgumentParser(prog="nemori-dspy", description="Nemori long-term memory as a DSPy pipeline")
    sub = p.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="run a benchmark").add_subparsers(dest="benchmark", required=True)
    lo = ev.add_parser("locomo", help="LoCoMo QA: build memory per conversation, answer, score, log to MLflow")
    lo.add_argument("--data", help="locomo10.json or a file in its schema (default: $NEMORI_LOCOMO_PATH, "
                                   "else download the upstream file into ~/.cache/nemori-dspy)")
    lo.add_argument("--conversations", help="comma-separated sample ids, e.g. conv-26,conv-30 (default: all)")
    lo.add_argument("--max-questions", type=int, help="cap on questions per conversation (categories 1-4)")
    lo.add_argument("--no-control", action="store_true", help="skip the no-memory control")
    lo.add_argument("--no-judge", action="store_true", help="skip the LLM judge")
    lo.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    lo.add_argument("--out", help="run folder (default runs/locomo-<time>)")
    lo.add_argument("--db", help="SQLite store file (default <out>/memory.sqlite3)")
    lo.add_argument("--no-cache", action="store_true", help="disable DSPy's response cache")
    lo.add_argument("-v", "--verbose", action="store_true")
    for name in _SETTING_FLAGS:
        lo.add_argument("--" + name.replace("_", "-"), dest=name, default=None)
    return p


def resolve_dataset(path: str | None) -> Path:
    """--data, else $NEMORI_LOCOMO_PATH, else the upstream locomo10.json downloaded once into the cache.

    The dataset is CC BY-NC 4.0: it is read from a path or fetched at run time, never shipped.
    """
    from .config import DEFAULT_CACHE_DIR
    from .errors import DatasetError

    path = path or os.environ.get("NEMORI_LOCOMO_PATH")
    if path:
        return Path(path)
    target = DEFAULT_CACHE_DIR / "locomo10.json"
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
    from .config import NemoriSettings

    overrides = {k: getattr(args, k) for k in _SETTING_FLAGS if getattr(args, k) is not None}
    if args.no_cache:
        overrides["cache"] = False
    return NemoriSettings(**overrides)


def _eval_locomo(args: argparse.Namespace) -> int:
    from .embedders import resolve_embedder
    from .eval.judge import LLMJudge
    from .eval.locomo import dataset_sha256, load_locomo
    from .eval.runner import EvalOptions, run_locomo
    from .memory import Memory
    from .runtime import build_runtime
    from .store.sqlite import SQLiteStore

    settings = _settings(args)
    data = resolve_dataset(args.data)
    ids = [s.strip() for s in args.conversations.split(",")] if args.conversations else None
    conversations = load_locomo(data, ids)
    out = Path(args.out or f"runs/locomo-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"dataset {data} ({len(conversations)} conversation(s)); run folder {out}", flush=True)
    t0 = time.perf_counter()
    with build_runtime(settings) as rt:
        print(f"model {rt.model_label} ready in {time.perf_counter() - t0:.1f}s", flush=True)
        embedder = resolve_embedder(settings)
        store = SQLiteStore(Path(args.db) if args.db else out / "memory.sqlite3")
        memory = Memory(store, embedder, settings, stage_lms=rt.stage_lms)
        judge = None if args.no_judge else LLMJudge(rt.judge_lm, max_tokens=settings.stage_max_tokens("judge"),
                                                    parse_retries=settings.parse_retries)
        opts = EvalOptions(max_questions=args.max_questions, control=not args.no_control)
        summary = run_locomo(memory, conversations, opts, judge, out)
        server_flags = rt.server.flags if rt.server else {}
    _print_summary(summary, time.perf_counter() - t0)
    if not args.no_mlflow:
        from .eval.tracking import log_eval_run, tracking_uri

        run_id = log_eval_run(settings, summary, out, {
            "dataset.path": str(data), "dataset.sha256": dataset_sha256(data),
            "dataset.conversations": ",".join(c.sample_id for c in conversations),
            "max_questions": args.max_questions, "model_label": rt.model_label, "embedder": embedder.name,
            "server": server_flags}, run_name=out.name)
        print(f"MLflow run {run_id} at {tracking_uri(settings)} (view: mlflow ui --backend-store-uri "
              f"{tracking_uri(settings)})")
    return 0


def _print_summary(summary: dict[str, Any], seconds: float) -> None:
    print("\nLLM calls, tokens and seconds per stage (construction + answering + judge):")
    print(summary["usage_table"])
    print("\nScores ×100 per category (n = questions):")
    print(summary["table"])
    for sid, cov in summary["coverage"].items():
        print(f"{sid}: {cov['messages']} turns, {cov['in_one_episode']} in exactly one episode, "
              f"{cov['in_no_episode']} in none, {cov['in_several']} in several; {cov['episodes']} episodes")
    c = summary["counters"]
    print(f"evoked context empty {c.get('evoke_empty', 0)}/{c.get('evoke_calls', 0)} times (τ on cosine); "
          f"insights {c.get('insights', 0)}, duplicates of an existing entry {c.get('insight_duplicates', 0)}; "
          f"partition repairs {c.get('partition_repairs', 0)}; retries {c.get('retries', 0)}; "
          f"episode merges {c.get('episode_merges', 0)}")
    if summary["parked"]:
        print(f"PARKED work ({len(summary['parked'])}): " + "; ".join(summary["parked"][:5]))
    print(f"total {seconds / 60:.1f} min (ingest {summary['ingest_seconds'] / 60:.1f} min)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nemori-dspy`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the embedded model server and open runs are closed cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .errors import NemoriError

    try:
        if args.command == "eval" and args.benchmark == "locomo":
            return _eval_locomo(args)
    except NemoriError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
