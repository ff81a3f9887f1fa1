"""``nemori-dspy optimize …``: the command-line face of ``optimizers/tune.py``.

Prints, per stage, the dev score before and after (mean with 95% CI and n), what the optimization cost per
model (LLM calls, tokens, seconds), what changed (new instruction, demos) and where the program was saved;
logs one MLflow run. Memory is shared with ``eval locomo``: the same construction key (settings, model,
program, dataset, slice) finds the same store, so an eval of the slice and an optimization reuse each other's
memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

__all__ = ["optimize_command", "print_results", "ignored_budget_flags"]


#: budget flags each optimizer reads (``optimize.make_optimizer``); others are reported as having no effect.
_BUDGET_FLAGS = {"bootstrap": {"max_demos"}, "labeled": {"max_demos"},
                 "mipro": {"auto", "num_trials", "num_candidates", "max_demos"},
                 "gepa": {"auto", "max_metric_calls"}, "simba": {"auto", "num_trials", "max_demos"}}


def ignored_budget_flags(args: argparse.Namespace) -> list[str]:
    """Budget flags given on the command line that the chosen optimizer does not use (or that another flag
    overrides: MIPROv2's ``--auto`` when ``--num-trials`` is given, ``--num-candidates`` without it)."""
    used = _BUDGET_FLAGS.get(args.optimizer, set())
    given = {k for k in ("auto", "max_metric_calls", "num_trials", "num_candidates") if getattr(args, k, None)}
    out = [k for k in sorted(given) if k not in used]
    if args.optimizer == "mipro" and args.num_trials and args.auto:
        out.append("auto")
    if args.optimizer == "mipro" and args.num_candidates and not args.num_trials:
        out.append("num_candidates")
    if args.optimizer == "gepa" and args.max_metric_calls and args.auto:
        out.append("auto")
    return ["--" + k.replace("_", "-") for k in out]


def _reflection(settings: Any, name: str) -> Any:
    """Settings whose judge slot carries the reflection model (the runtime starts its server)."""
    return settings.model_copy(update={"judge_model": None if name.strip().lower() in ("", "none") else name})


def _charged_reflection(rt: Any, name: str) -> Any:
    """The reflection LM, charged to ``reflection`` in the ledger (a copy when it is the student's own LM)."""
    from nemori_dspy.optimizers.tune import REFLECTION_STAGE

    if name.strip().lower() in ("", "none"):
        return None
    lm = rt.judge_lm.copy() if rt.judge_lm is rt.lm else rt.judge_lm
    lm.charge_stage = REFLECTION_STAGE
    return lm


def optimize_command(args: argparse.Namespace) -> int:
    """Run ``optimize`` from parsed arguments; returns the exit code (errors raise ``NemoriError``)."""
    from nemori_dspy.cli import _ids, _program_state, _run_dir, _settings, resolve_dataset
    from nemori_dspy.eval.locomo import dataset_sha256, load_locomo, parse_sessions, slice_sessions
    from nemori_dspy.optimizers.datasets import check_split
    from nemori_dspy.optimizers.optimize import Budget, check_available
    from nemori_dspy.optimizers.tune import parse_stages
    from nemori_dspy.usage import UsageLedger

    stages = parse_stages(args.stage, end_to_end=args.metric == "end-to-end")
    check_available(args.optimizer)
    for flag in ignored_budget_flags(args):
        print(f"note: {flag} has no effect with --optimizer {args.optimizer}", flush=True)
    logging.getLogger("dspy.teleprompt").setLevel(logging.INFO)  # optimizer progress (iterations, trial scores)
    settings = _settings(args)
    train_ids, dev_ids = _ids(args.train) or [], _ids(args.dev) or []
    if getattr(args, "slice", None):  # a named slice: its sessions; --train / --dev default to its conversations
        from nemori_dspy.eval.locomo import named_slice

        slice_ids, slice_sessions_ = named_slice(args.slice)
        train_ids, dev_ids = train_ids or slice_ids[:-1], dev_ids or slice_ids[-1:]
        if not train_ids:
            from nemori_dspy.errors import ConfigError

            raise ConfigError(f"--slice {args.slice} holds one conversation ({', '.join(slice_ids)}), which is the "
                              "dev set. Fix: name train conversations with --train (e.g. --train conv-26,conv-30).")
        args.sessions = slice_sessions_.label() if slice_sessions_ else None
    check_split(train_ids, dev_ids)
    sessions = parse_sessions(args.sessions)
    data = resolve_dataset(args.data, settings)
    convs = {c.sample_id: slice_sessions(c, sessions) for c in load_locomo(data, train_ids + dev_ids)}
    data_sha, program = dataset_sha256(data), _program_state(args.program)
    budget = Budget(auto=args.auto, max_metric_calls=args.max_metric_calls, num_trials=args.num_trials,
                    num_candidates=args.num_candidates, num_threads=args.num_threads,
                    max_bootstrapped_demos=args.max_demos, max_labeled_demos=args.max_demos)
    out = _run_dir(args, "optimize")
    print(f"optimize {','.join(stages)} with {args.optimizer} on sessions {args.sessions} of {data}; train "
          f"{','.join(train_ids)} ({sum(len(convs[i].messages) for i in train_ids)} turns), dev {','.join(dev_ids)} "
          f"({sum(len(convs[i].messages) for i in dev_ids)} turns); run folder {out}", flush=True)
    t0 = time.perf_counter()
    params = {"stages": ",".join(stages), "optimizer": args.optimizer, "metric": args.metric, "max_train": args.max_train, "budget": budget.model_dump(),
              "model.reflection_setting": args.reflection_model, "train": ",".join(train_ids),
              "dev": ",".join(dev_ids), "sessions": args.sessions, "dataset.path": str(data),
              "dataset.sha256": data_sha, "program.start": args.program, "out": str(out)}
    with contextlib.ExitStack() as stack:
        stack.enter_context(UsageLedger().charging())  # this optimization's usage, apart from any other run
        run = None
        if not args.no_mlflow:
            from nemori_dspy.optimizers.tracking import optimize_run

            run = stack.enter_context(optimize_run(settings, params, out.name))
        _optimize(args, stack, settings, run, stages, convs, train_ids, dev_ids, data_sha, program, sessions,
                  budget, out, t0)
    return 0


def _optimize(args: argparse.Namespace, stack: Any, settings: Any, run: Any, stages: list[str], convs: dict,
              train_ids: list[str], dev_ids: list[str], data_sha: str, program: Any, sessions: Any, budget: Any,
              out: Path, t0: float) -> None:
    from nemori_dspy.cli import _memory_provider
    from nemori_dspy.eval.systems import SYSTEMS
    from nemori_dspy.optimizers.tune import OptimizeOptions, ensure_built, run_optimize
    from nemori_dspy.runtime import build_runtime

    with build_runtime(_reflection(settings, args.reflection_model)) as rt:
        print(f"student {rt.model_label}, reflection {rt.judge_label if args.reflection_model != 'none' else 'none'} "
              f"ready in {time.perf_counter() - t0:.1f}s", flush=True)
        provider, _ = _memory_provider(args, settings, rt, data_sha, program, sessions.label() if sessions else None)
        system = SYSTEMS["nemori"]
        memory, records = provider.memory(system), provider.record_path(system)
        ordered = [convs[i] for i in train_ids + dev_ids]
        built = ensure_built(memory, ordered, records, lambda sid: provider.is_built(system, sid),
                             lambda sid: provider.mark_built(system, sid))
        construction = memory.usage.snapshot()  # the memory's own calls: its construction (none when reused)
        print(f"memory {provider.path(system)}: " + (f"built {', '.join(built)} now" if built else
                                                     "reused (built and recorded by an earlier run)"), flush=True)
        opts = OptimizeOptions(stages=stages, optimizer=args.optimizer, train=[convs[i] for i in train_ids],
                               dev=[convs[i] for i in dev_ids], out_dir=out, budget=budget,
                               reflection_lm=_charged_reflection(rt, args.reflection_model), metric=args.metric,
                               max_train=args.max_train)
        if run is not None:
            import mlflow

            mlflow.log_params({"model.student": rt.model_label, "model.reflection": rt.judge_label,
                               "memory.store": str(provider.path(system))})
        results = run_optimize(memory, records, opts)
    seconds = time.perf_counter() - t0
    print_results(results, out, seconds, construction,
                  eval_hint=f"--data {args.data or '<data>'} --sessions {args.sessions} --conversations {','.join(dev_ids)}")
    if run is not None:
        from nemori_dspy.optimizers.tracking import log_results
        from nemori_dspy.eval.tracking import tracking_uri

        versions = log_results(results, out, seconds, construction)
        print(f"MLflow run {run.info.run_id} in experiment {settings.mlflow_experiment}-optimize at "
              f"{tracking_uri(settings)}" + (f"; tuned prompts registered: {versions}" if versions else ""))


def _cost_lines(cost: dict[str, dict[str, Any]]) -> list[str]:
    from nemori_dspy.optimizers.tune import REFLECTION_STAGE

    groups: dict[str, dict[str, float]] = {}
    for name, u in cost.items():
        who = "reflection model" if name == REFLECTION_STAGE else "student"
        g = groups.setdefault(who, {"calls": 0, "cache_hits": 0, "input_tokens": 0, "output_tokens": 0, "seconds": 0.0})
        for k in g:
            g[k] += u.get(k, 0)
    return [f"    {who}: {g['calls']:.0f} LLM calls ({g['cache_hits']:.0f} cached), {g['input_tokens']:,.0f} in / "
            f"{g['output_tokens']:,.0f} out tokens, {g['seconds']:.0f} s" for who, g in groups.items()]


def print_results(results: list[Any], out: Path, seconds: float, construction: dict[str, Any],
                  eval_hint: str = "") -> None:
    """The human summary of an optimization (see the module docstring); ``eval_hint`` completes the suggested
    ``eval locomo`` command (data, slice, dev conversations)."""
    built = sum(u.calls for u in construction.values())
    print(f"\nmemory construction before tuning: {built} LLM calls")
    for r in results:
        delta = 100 * (r.after.mean - r.before.mean)
        print(f"\n[{r.stage}] dev (held-out conversations), {r.n_train} train / {r.n_dev} dev examples:")
        print(f"    before {r.before.cell()}")
        print(f"    after  {r.after.cell()}   ({delta:+.1f} points)")
        paired = r.paired() if hasattr(r, "paired") else None  # same dev examples before and after
        if paired:
            from nemori_dspy.eval.metrics import paired_line

            print("    " + paired_line("paired", paired, "before", "after"))
        for cat, c in r.by_category.items():
            print(f"    {cat:<12} n={c['n']:<3} before {100 * c['before']:.1f}  after {100 * c['after']:.1f}")
        print(f"  cost of optimizing ({r.seconds / 60:.1f} min):")
        for line in _cost_lines(r.cost):
            print(line)
        for name, ch in r.changes.items():
            what = "new instruction" if ch["instruction_changed"] else "instruction unchanged"
            print(f"  {name}: {what}, {ch['demos']} demo(s)")
            if ch["instruction_changed"]:
                print("    " + json.dumps(ch["instruction"])[:600])
    print(f"\nprogram saved to {out / 'program.json'} (held-out check: nemori-dspy eval locomo {eval_hint} "
          f"--program {out / 'program.json'}); "
          f"results in {out / 'result.json'}; total {seconds / 60:.1f} min")
