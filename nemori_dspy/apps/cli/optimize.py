"""``nemori-dspy optimize …``: the command-line face of ``optimizers/tune.py``.

Prints, per stage, the dev score before and after (mean with 95% CI and n), what the optimization cost per
model (LLM calls, tokens, seconds), what changed (new instruction, demos) and where the program was saved;
logs one MLflow run. Memory is shared with ``eval locomo``: the same construction key (settings, model,
program, dataset, slice) finds the same store, so an eval of the slice and an optimization reuse each other's
memory. The run is built through ``apps.context.RunContext`` like every other command.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import click

from nemori_dspy.apps.cli.options import (OPTIMIZE_SETTINGS, POSITIVE_INT, SLICE_HELP, data_option, no_cache_option,
                                          out_option, setting_options, verbose_option)
from nemori_dspy.apps.context import RunContext, resolve_dataset, run_dir, split_ids, stage_models
from nemori_dspy.optimizers.names import OPTIMIZERS  # a constant: no dspy, no metrics module

if TYPE_CHECKING:
    from nemori_dspy.optimizers.tune import StageResult

__all__ = ["optimize", "optimize_command", "print_results", "ignored_budget_flags", "MIN_AUDIT_ON_WRONG"]


#: budget flags each optimizer reads (``optimize.make_optimizer``); others are reported as having no effect.
_BUDGET_FLAGS = {"bootstrap": {"max_demos"}, "labeled": {"max_demos"},
                 "mipro": {"auto", "num_trials", "num_candidates", "max_demos"},
                 "gepa": {"auto", "max_metric_calls"}, "simba": {"auto", "num_trials", "max_demos"}}


def ignored_budget_flags(args: Any) -> list[str]:
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


#: the judge must label at least this share of the audit's wrong answers WRONG before it may score tuning.
MIN_AUDIT_ON_WRONG = 0.5


def _answer_metric(args: Any, rt: Any, stages: list[str], train: list[Any], run: Any) -> Any:
    """P_ans's metric for this run: ``JudgeF1Metric`` on the reflection model (the run's judge) per
    ``--answer-metric``, after auditing that judge on LoCoMo calibration pairs of the train conversations; None
    (token F1) with ``--answer-metric f1``, without an answer stage, or in end-to-end mode.

    Raises:
        ConfigError: the judge labels fewer than ``MIN_AUDIT_ON_WRONG`` of the audit's wrong answers WRONG
            (a metric it would hand out for free).
    """
    from nemori_dspy.optimizers.metrics import ANSWER_METRICS, JudgeF1Metric

    weight = ANSWER_METRICS[args.answer_metric]
    if "answer" not in stages or args.metric == "end-to-end" or weight == 0:
        return None
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.eval.judge import LLMJudge
    from nemori_dspy.eval.judge_audit import audit_table, locomo_audit_pairs, run_audit
    from nemori_dspy.eval.locomo import SCORED_CATEGORIES

    lm = rt.judge_lm.copy()
    lm.charge_stage = None  # charged to ``judge``, apart from the reflection model's own calls
    judge = LLMJudge(lm, max_tokens=rt.settings.stage_max_tokens("judge"), parse_retries=rt.settings.parse_retries,
                     model_label=rt.judge_label)
    pairs = locomo_audit_pairs(train, SCORED_CATEGORIES, None, rt.settings.judge_audit)
    audit = run_audit({"judge": judge}, pairs) if pairs else None
    print(f"answer metric {args.answer_metric}: judge {rt.judge_label} × {weight} + token F1 × {1 - weight}"
          + (f"; judge audit on {len(pairs)} train pairs:\n{audit_table(audit)}" if audit else
             "; no judge audit (NEMORI_JUDGE_AUDIT=0 or no eligible pair)"), flush=True)
    if audit and run is not None:
        import mlflow

        mlflow.log_metrics({f"answer_metric.audit.{k}": float(v) for k, v in audit["judge"].items() if v is not None})
    on_wrong = audit["judge"]["on_wrong"] if audit else None
    if on_wrong is not None and on_wrong < MIN_AUDIT_ON_WRONG:
        raise ConfigError(f"the judge {rt.judge_label} labelled only {100 * on_wrong:.0f}% of the audit's wrong "
                          f"answers WRONG (need {100 * MIN_AUDIT_ON_WRONG:.0f}%), so tuning on it would reward wrong "
                          "answers. Fix: a stronger --reflection-model (it is the judge), or --answer-metric f1.")
    return JudgeF1Metric(judge, weight)


@click.command("optimize", help="tune stage prompts with a DSPy optimizer on a LoCoMo slice: train, select on dev, "
                                      "score dev and held-out test before/after with paired CIs")
@click.option("--stage", required=True, help="stage(s), comma-separated, tuned in pipeline order: narrate, "
                                             "anticipate, distill, anticipate+distill, consolidate, answer")
@click.option("--optimizer", default="gepa", type=click.Choice(OPTIMIZERS), help="DSPy optimizer (default gepa)")
@data_option("locomo10.json or a file in its schema (as for eval locomo)")
@click.option("--sessions", default="1-3", help="LoCoMo slice A-B (default 1-3)")
@click.option("--slice", "slice_name", default=None,
              help=SLICE_HELP + "; replaces --sessions, and --train/--dev default to its conversations not in "
                                "--test but the last / the last (a one-conversation slice is dev: give --train)")
@click.option("--train", default=None, help="train conversations, e.g. conv-26,conv-30 (required without --slice)")
@click.option("--dev", default=None, help="dev conversations the optimizer selects on, e.g. conv-41 (never in "
                                          "--train; required without --slice); its after-score is optimistic: "
                                          "--test is held out")
@click.option("--test", default=None, help="test conversations, scored before and after and never selected on (in "
                                           "neither --train nor --dev), e.g. conv-42,conv-43: the held-out estimate")
@click.option("--answer-metric", default="judge+f1", type=click.Choice(["judge+f1", "judge", "f1"]),
              help="the answer stage's metric: judge+f1 (default; mean of the LLM judge's verdict and token F1), "
                   "judge, or f1 alone (rewards brevity); the judge is --reflection-model, audited first")
@out_option("run folder (default runs/optimize-<time>): program.json, result.json")
@click.option("--auto", default=None, type=click.Choice(["light", "medium", "heavy"]),
              help="MIPROv2/GEPA/SIMBA budget preset")
@click.option("--max-metric-calls", type=POSITIVE_INT, default=None, help="GEPA: metric calls in all")
@click.option("--num-trials", type=POSITIVE_INT, default=None, help="MIPROv2 trials (auto off) / SIMBA steps")
@click.option("--num-candidates", type=POSITIVE_INT, default=None,
              help="MIPROv2 candidates when --num-trials is given")
@click.option("--max-train", type=POSITIVE_INT, default=None,
              help="keep at most N train examples (seeded sample; dev is always whole)")
@click.option("--examples", "examples", type=click.Choice(["records", "sessions"]), default="records",
              help="narrate's examples: 'records' of the memory built for each split (default) or 'sessions': each "
                   "LoCoMo session rendered as P_nar sees an episode, with no memory built when narrate is the only "
                   "stage (every session of every split counts; the default forms one episode per session)")
@click.option("--num-threads", type=POSITIVE_INT, default=1, help="parallel program calls (default 1)")
@click.option("--max-demos", type=int, default=4, help="bootstrapped and labeled demos per predictor (default 4)")
@click.option("--reflection-model", default="local:1.5b",
              help="prompt/reflection/teacher model: local:0.5b, local:1.5b (default; a second embedded server), "
                   "a litellm model string, or 'none' for the student itself")
@click.option("--metric", default="stage", type=click.Choice(["stage", "end-to-end"]),
              help="stage: the stage's own LLM-free metric on recorded calls (minutes); end-to-end: rebuild each "
                   "conversation's memory per candidate and score its answers' F1 (hours)")
@click.option("--program", default=None, help="start from a saved pipeline state instead of the default prompts")
@click.option("--no-mlflow", is_flag=True, help="do not log to MLflow")
@no_cache_option()
@verbose_option("log INFO (optimizer progress, repairs, retries)")
@setting_options(OPTIMIZE_SETTINGS)
def optimize(**flags: Any) -> int:
    """``optimize``: tune ``--stage`` with ``--optimizer`` on a LoCoMo slice (``optimize_command``)."""
    return optimize_command(flags)


def optimize_command(flags: dict[str, Any]) -> int:
    """Run ``optimize`` from its parsed flags (flag destination → value, as the ``optimize`` command passes them);
    returns the exit code.

    Raises:
        NemoriError: a bad split, slice, program, setting or optimizer (before any model is loaded), or a judge
            that fails its audit.
    """
    from nemori_dspy.eval.locomo import dataset_sha256, load_locomo, parse_sessions, slice_sessions
    from nemori_dspy.optimizers.datasets import check_split
    from nemori_dspy.optimizers.optimize import Budget, check_available
    from nemori_dspy.optimizers.tune import parse_stages
    from nemori_dspy.usage import UsageLedger

    args = SimpleNamespace(**flags)
    stages = parse_stages(args.stage, end_to_end=args.metric == "end-to-end")
    check_available(args.optimizer)
    for flag in ignored_budget_flags(args):
        print(f"note: {flag} has no effect with --optimizer {args.optimizer}", flush=True)
    logging.getLogger("dspy.teleprompt").setLevel(logging.INFO)  # optimizer progress (iterations, trial scores)
    ctx = RunContext.from_flags(flags, OPTIMIZE_SETTINGS)
    settings = ctx.settings
    train_ids, dev_ids, test_ids = split_ids(args.train) or [], split_ids(args.dev) or [], split_ids(args.test) or []
    if args.slice_name:  # a named slice: its sessions; --train / --dev default to its conversations
        from nemori_dspy.eval.locomo import named_slice

        slice_ids, slice_sessions_ = named_slice(args.slice_name)
        rest = [i for i in slice_ids if i not in train_ids + test_ids]
        train_ids, dev_ids = train_ids or rest[:-1], dev_ids or rest[-1:]
        args.sessions = slice_sessions_.label() if slice_sessions_ else None
    check_split(train_ids, dev_ids, test_ids, slice_name=args.slice_name)
    sessions = parse_sessions(args.sessions)
    data = resolve_dataset(args.data, settings)
    convs = {c.sample_id: slice_sessions(c, sessions) for c in load_locomo(data, train_ids + dev_ids + test_ids)}
    data_sha, program = dataset_sha256(data), ctx.program(args.program)
    budget = Budget(auto=args.auto, max_metric_calls=args.max_metric_calls, num_trials=args.num_trials,
                    num_candidates=args.num_candidates, num_threads=args.num_threads,
                    max_bootstrapped_demos=args.max_demos, max_labeled_demos=args.max_demos)
    out = run_dir(args.out, "optimize")
    print(f"optimize {','.join(stages)} with {args.optimizer} on sessions {args.sessions} of {data}; train "
          f"{','.join(train_ids)} ({sum(len(convs[i].messages) for i in train_ids)} turns), dev {','.join(dev_ids)} "
          f"({sum(len(convs[i].messages) for i in dev_ids)} turns), test {','.join(test_ids) or 'none'} "
          f"({sum(len(convs[i].messages) for i in test_ids)} turns); run folder {out}", flush=True)
    if not test_ids:
        print("note: no --test conversations: the optimizer selects on dev, so the dev score after tuning is not a "
              "held-out estimate. Fix: add --test with conversations in neither --train nor --dev.", flush=True)
    t0 = time.perf_counter()
    params = {"stages": ",".join(stages), "optimizer": args.optimizer, "metric": args.metric, "max_train": args.max_train, "examples": args.examples, "budget": budget.model_dump(),
              "model.reflection_setting": args.reflection_model, "train": ",".join(train_ids),
              "dev": ",".join(dev_ids), "test": ",".join(test_ids), "answer_metric": args.answer_metric,
              "sessions": args.sessions, "dataset.path": str(data),
              "dataset.sha256": data_sha, "program.start": args.program, "out": str(out)}
    with contextlib.ExitStack() as stack:
        stack.enter_context(UsageLedger().charging())  # this optimization's usage, apart from any other run
        run = None
        if not args.no_mlflow:
            from nemori_dspy.optimizers.tracking import optimize_run

            run = stack.enter_context(optimize_run(settings, params, out.name))
        _optimize(args, ctx, run, stages, convs, (train_ids, dev_ids, test_ids), data_sha, program, sessions,
                  budget, out, t0)
    return 0


def _optimize(args: Any, ctx: RunContext, run: Any, stages: list[str], convs: dict,
              splits: tuple[list[str], list[str], list[str]], data_sha: str, program: Any, sessions: Any, budget: Any,
              out: Path, t0: float) -> None:
    from nemori_dspy.eval.systems import SYSTEMS
    from nemori_dspy.optimizers.tune import OptimizeOptions, ensure_built, run_optimize

    train_ids, dev_ids, test_ids = splits
    settings = ctx.settings
    with ctx.runtime(_reflection(settings, args.reflection_model)) as rt:
        served = f" ({stage_models(rt)})" if rt.stage_lms else ""
        print(f"student {rt.model_label}{served}, reflection "
              f"{rt.judge_label if args.reflection_model != 'none' else 'none'} ready in {time.perf_counter() - t0:.1f}s",
              flush=True)
        provider, _ = ctx.memory_provider(rt, data_sha, program, sessions.label() if sessions else None)
        system = SYSTEMS["nemori"]
        memory, records = provider.memory(system), provider.record_path(system)
        ordered = [convs[i] for i in train_ids + dev_ids + test_ids]
        if args.examples == "sessions" and stages == ["narrate"] and args.metric == "stage":
            print("memory: not built (narrate's examples are LoCoMo's sessions)", flush=True)
        else:
            built = ensure_built(memory, ordered, records, lambda sid: provider.is_built(system, sid),
                                 lambda sid: provider.mark_built(system, sid))
            print(f"memory {provider.path(system)}: " + (f"built {', '.join(built)} now" if built else
                                                         "reused (built and recorded by an earlier run)"), flush=True)
        construction = memory.usage.snapshot()  # the memory's own calls: its construction (none when reused)
        opts = OptimizeOptions(stages=stages, optimizer=args.optimizer, train=[convs[i] for i in train_ids],
                               dev=[convs[i] for i in dev_ids], test=[convs[i] for i in test_ids], out_dir=out,
                               budget=budget, reflection_lm=_charged_reflection(rt, args.reflection_model),
                               metric=args.metric, max_train=args.max_train, examples=args.examples,
                               answer_metric=_answer_metric(args, rt, stages, [convs[i] for i in train_ids], run))
        if run is not None:
            import mlflow

            mlflow.log_params({"model.student": rt.model_label, "model.reflection": rt.judge_label,
                               "memory.store": str(provider.path(system))})
        results = run_optimize(memory, records, opts)
    seconds = time.perf_counter() - t0
    print_results(results, out, seconds, construction,
                  eval_hint=f"--data {args.data or '<data>'} --sessions {args.sessions} --conversations "
                            f"{','.join(test_ids or dev_ids)}")
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


def _split_lines(r: StageResult, split: str) -> list[str]:
    """Before / after / paired lines (and the paired metric parts) of one split ("dev" or "test")."""
    from nemori_dspy.eval.metrics import paired_line

    before, after = r.scores(split)
    what = ("the optimizer selected on it: optimistic" if split == "dev" else
            "labelled cases of group c, which no optimizer step saw" if r.stage == "consolidate" else
            "conversations no optimizer step saw")
    n = r.n_dev if split == "dev" else r.n_test
    lines = [f"  {split} ({what}), {n} examples:", f"    before {before.cell()}",
             f"    after  {after.cell()}   ({100 * (after.mean - before.mean):+.1f} points)"]
    paired = r.paired(split)  # same examples before and after
    if paired:
        lines.append("    " + paired_line("paired", paired, "before", "after"))
    for part, p in r.paired_parts(split).items():
        lines.append("    " + paired_line(f"paired {part}", p, "before", "after"))
    return lines


def print_results(results: list[Any], out: Path, seconds: float, construction: dict[str, Any],
                  eval_hint: str = "") -> None:
    """The human summary of an optimization (see the module docstring): per stage the dev and (with ``--test``)
    test scores before/after with paired bootstrap CIs of the difference, the answer stage's judge and F1 side by
    side; ``eval_hint`` completes the suggested ``eval locomo`` command (data, slice, test or dev conversations)."""
    built = sum(u.calls for u in construction.values())
    print(f"\nmemory construction before tuning: {built} LLM calls")
    for r in results:
        print(f"\n[{r.stage}] {r.n_train} train / {r.n_dev} dev / {r.n_test} test examples"
              + (f"; recorded calls on train: {r.calls_on_train}" if r.calls_on_train else ""))
        for line in _split_lines(r, "dev") + (_split_lines(r, "test") if r.test_before else []):
            print(line)
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
