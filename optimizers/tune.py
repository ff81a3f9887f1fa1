"""``nemori-dspy optimize``: tune one or more stages against a LoCoMo slice: train, dev and test conversations.

Flow (``run_optimize``): build (or reuse) the slice's memory for the train, dev and test conversations with the
program as it is, recording every stage call beside it (``recording.py``) → per stage, in pipeline order:
refuse a construction stage the train build never called → examples from the records (construction stages) or
from retrieval (``answer``), split by conversation → dev and test scored before → compile on train, the
optimizer selecting on dev (MIPROv2's and GEPA's ``valset``) → dev and test scored after → the tuned stage is
written into the pipeline → ``program.json`` + ``result.json`` in the run folder, and one MLflow run.

Dev chose the program, so its after-score is optimistic; test (conversations no optimizer step saw) is the
held-out estimate, paired before/after over the same examples on the same memory.

Construction stages tuned after another one see records of the memory built *before* tuning (a trial
re-runs one stage call; rebuilding memory per trial is the end-to-end mode's job).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import dspy

from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.locomo import CATEGORY_NAMES, LoCoMoConversation
from nemori_dspy.eval.metrics import mean_ci95
from nemori_dspy.memory import Memory
from nemori_dspy.optimizers.answer import AnswerProgram, locomo_answer_examples
from nemori_dspy.optimizers.datasets import (check_split, consolidate_examples, distill_examples, narrate_examples,
                                             narrate_session_examples)
from nemori_dspy.optimizers.metrics import STAGE_METRICS, end_to_end_metric
from nemori_dspy.optimizers.optimize import Budget, DevScore, keep_task_instructions, make_optimizer, score_program
from nemori_dspy.optimizers.programs import (ConsolidateProgram, DistillProgram, EndToEndProgram, NarrateProgram,
                                             StageProgram, end_to_end_questions)
from nemori_dspy.recording import StageRecord, read_records
from nemori_dspy.stages import TUNABLE_STAGES
from nemori_dspy.usage import Usage, UsageLedger

__all__ = ["TUNABLE_STAGES", "OptimizeOptions", "StageResult", "parse_stages", "stage_program", "stage_examples",
           "run_optimize", "program_changes", "REFLECTION_STAGE", "check_stage_ran", "RECORDED_AS"]

log = logging.getLogger(__name__)

#: ledger name the prompt/reflection model's calls are charged to (``UsageTrackingMixin.charge_stage``).
REFLECTION_STAGE = "reflection"


def parse_stages(text: str, end_to_end: bool = False) -> list[str]:
    """``"answer,narrate"`` → ``["narrate", "answer"]`` (pipeline order, duplicates dropped).

    ``partition`` is accepted only with ``end_to_end`` (it has no stage metric).

    Raises:
        ConfigError: an unknown stage (``partition`` says why it has no stage metric).
    """
    names = [s.strip() for s in text.split(",") if s.strip()]
    if end_to_end:
        bad = [n for n in names if n not in ("partition", *TUNABLE_STAGES)]
        if bad or not names:
            raise ConfigError(f"unknown stage(s) {bad or text!r}. Fix: choose from partition, "
                              f"{', '.join(TUNABLE_STAGES)}.")
        return [s for s in ("partition", *TUNABLE_STAGES) if s in names]
    if "partition" in names:
        raise ConfigError("partition has no stage metric: a valid partition is enforced by repair and LoCoMo's "
                          "session boundaries by the time-gap split, so its only labels are already met. "
                          "Fix: tune narrate/distill/answer, or partition with --metric end-to-end.")
    bad = [n for n in names if n not in TUNABLE_STAGES]
    if bad or not names:
        raise ConfigError(f"unknown stage(s) {bad or text!r}. Fix: choose from {', '.join(TUNABLE_STAGES)}.")
    return [s for s in TUNABLE_STAGES if s in names]


#: stage → (setting, value under which the pipeline runs that stage's batched predictor instead of it).
_BATCHED_INSTEAD = {"narrate": ("narration_mode", "batched"), "consolidate": ("consolidation_mode", "batched")}


def stage_program(stage: str, pipeline: Any) -> StageProgram:
    """The program that tunes ``stage`` (see ``optimizers.programs``).

    Raises:
        ConfigError: unknown stage, or a per-item stage the pipeline's cost switches replace by its batched
            predictor (tuning it would change a predictor that runs only on fallbacks).
    """
    setting, value = _BATCHED_INSTEAD.get(stage, (None, None))
    if setting and getattr(pipeline.res.settings, setting) == value:
        raise ConfigError(f"{setting}={value!r}: the pipeline runs {stage}_batch, so a tuned {stage!r} would "
                          f"run only on fallbacks. Fix: tune with NEMORI_{setting.upper()}=per_"
                          f"{'group' if stage == 'narrate' else 'insight'} (and run with it).")
    if stage == "narrate":
        return NarrateProgram(pipeline)
    if stage in ("anticipate", "distill"):
        return DistillProgram(pipeline, (stage,))
    if stage == "anticipate+distill":
        return DistillProgram(pipeline, ("anticipate", "distill"))
    if stage == "consolidate":
        return ConsolidateProgram(pipeline)
    if stage == "answer":
        return AnswerProgram(pipeline)
    raise ConfigError(f"unknown stage {stage!r}. Fix: choose from {', '.join(TUNABLE_STAGES)}.")


def stage_metric(stage: str, answer_metric: Callable[..., Any] | None = None,
                 embedder: Any = None) -> Callable[..., Any]:
    """The stage's metric (``optimizers.metrics.STAGE_METRICS``); ``answer_metric`` replaces P_ans's token F1
    (``JudgeF1Metric``: judge and F1 together, what ``optimize --stage answer`` uses by default); with an
    ``embedder``, narrate and distill are scored against LoCoMo's gold observations (``ObservationMetric``,
    answer coverage where a conversation has none)."""
    if stage == "answer" and answer_metric is not None:
        return answer_metric
    key = "distill" if "distill" in stage or stage == "anticipate" else stage
    if embedder is not None and key in ("narrate", "distill"):
        from nemori_dspy.eval.memory_quality import FactMatcher
        from nemori_dspy.optimizers.metrics import ObservationMetric

        return ObservationMetric(FactMatcher(embedder), key)
    return STAGE_METRICS[key]


#: tunable stage → the recorded stage calls it needs on the train build (``recording.StageRecord.stage``).
RECORDED_AS = {"narrate": ("narrate",), "anticipate": ("anticipate",), "distill": ("distill",),
               "anticipate+distill": ("anticipate", "distill"), "consolidate": ("consolidate", "consolidate_batch")}
#: why the pipeline may skip a stage, and the setting that decides it.
_WHY_SKIPPED = {
    "narrate": "every episode is narrated unless NEMORI_NARRATION_MODE=batched runs narrate_batch instead",
    "anticipate": "P_ant runs only for an episode whose cue evokes facts already in semantic memory unless "
                  "NEMORI_ANTICIPATE_WITHOUT_FACTS=true",
    "distill": "P_dis runs once per episode unless NEMORI_DISTILLATION=direct or semantic memory is off",
    "consolidate": "P_con runs only when a new fact's nearest entries clear NEMORI_CONSOLIDATION_MIN_SIMILARITY "
                   "(and NEMORI_CONSOLIDATION=true)",
}


def check_stage_ran(stage: str, records: list[StageRecord], train_ids: list[str]) -> dict[str, int]:
    """Refuse to tune a construction stage the train build never called (a tuned prompt that never runs
    changes nothing, and its examples would be empty or invented).

    Returns:
        ``{recorded stage: calls on the train conversations}`` for the stages ``stage`` needs.
    Raises:
        ConfigError: one of them has no recorded call on the train conversations (names the reason and fix).
    """
    needed = RECORDED_AS.get(stage)
    if not needed:
        return {}
    train = set(train_ids)
    calls = {name: sum(1 for r in records if r.stage == name and r.meta.get("user_id") in train) for name in needed}
    if stage == "consolidate":  # either predictor counts: the batched one replaces the per-insight one
        if sum(calls.values()):
            return calls
        missing = ["consolidate"]
    else:
        missing = [name for name, n in calls.items() if n == 0]
    if missing:
        why = "; ".join(_WHY_SKIPPED[m] for m in missing)
        raise ConfigError(f"stage {stage!r}: building the train conversations ({', '.join(train_ids)}) recorded "
                          f"no {'/'.join(missing)} call, so there is nothing to tune it on and a tuned prompt "
                          f"would not change what they store. Why: {why}. Fix: pick train conversations (or "
                          f"--sessions) where the stage runs (eval locomo prints a Stage-activity table), or "
                          f"change that setting for both tuning and running.")
    return calls


def stage_examples(stage: str, memory: Memory, records: list[StageRecord],
                   conversations: list[LoCoMoConversation]) -> list[dspy.Example]:
    """The stage's examples for these conversations (``records`` of the built memory for construction
    stages, retrieval for answer)."""
    if stage == "answer":
        return locomo_answer_examples(memory, conversations)
    if stage == "consolidate":
        raise ConfigError("consolidate examples are the labelled cases (datasets.consolidation_cases), not records.")
    if stage == "narrate":
        return narrate_examples(records, conversations)
    return distill_examples(records, conversations)


def program_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per predictor of a program's ``dump_state()``: the new instruction if it changed, and the demo count."""
    out: dict[str, dict[str, Any]] = {}
    for name, state in after.items():
        if not isinstance(state, dict) or "signature" not in state:
            continue
        old = before.get(name, {}).get("signature", {}).get("instructions")
        new = state["signature"].get("instructions")
        out[name] = {"instruction_changed": new != old, "instruction": new, "demos": len(state.get("demos", []))}
    return out


@dataclass
class OptimizeOptions:
    """What ``run_optimize`` does. ``reflection_lm`` teaches (MIPROv2 prompt model, GEPA reflection, SIMBA,
    Bootstrap teacher); None = the student itself."""

    stages: list[str]
    optimizer: str
    train: list[LoCoMoConversation]
    dev: list[LoCoMoConversation]
    out_dir: Path
    test: list[LoCoMoConversation] = field(default_factory=list)  # scored before/after only, never selected on
    answer_metric: Callable[..., Any] | None = None  # P_ans metric (``JudgeF1Metric``); None = token F1
    budget: Budget = field(default_factory=Budget)
    reflection_lm: dspy.BaseLM | None = None
    progress: bool = True
    metric: str = "stage"  # or "end-to-end": rebuild each conversation's memory per candidate, score answers
    max_train: int | None = None  # keep at most this many train examples (a seeded sample), None = all
    examples: str = "records"  # narrate's examples: "records" of the built memory or "sessions" (no memory needed)

    def __post_init__(self) -> None:
        if self.examples not in ("records", "sessions"):
            raise ConfigError(f"examples={self.examples!r}: use 'records' or 'sessions'.")
        if self.examples == "sessions" and "narrate" not in self.stages:
            raise ConfigError("--examples sessions gives narrate its examples from LoCoMo's sessions; no stage of "
                              f"{self.stages} is narrate. Fix: drop --examples or add narrate to --stage.")

    def from_sessions(self, stage: str) -> bool:
        """Whether ``stage``'s examples are LoCoMo's sessions (``datasets.narrate_session_examples``)."""
        return stage == "narrate" and self.examples == "sessions"


@dataclass
class StageResult:
    """One tuned stage: sizes, dev (and test) scores before/after, what changed, cost of optimizing, wall seconds.

    ``by_category`` splits the test scores (the dev scores without a test set) by LoCoMo category.
    ``test_before`` / ``test_after`` are None when the run had no ``--test`` conversations or the stage has no
    test examples there (``consolidate``'s test is the labelled cases' group "c" whenever ``--test`` is given).
    """

    stage: str
    n_train: int
    n_dev: int
    before: DevScore
    after: DevScore
    changes: dict[str, dict[str, Any]]
    cost: dict[str, dict[str, Any]]
    seconds: float
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)
    test_before: DevScore | None = None
    test_after: DevScore | None = None
    calls_on_train: dict[str, int] = field(default_factory=dict)

    @property
    def n_test(self) -> int:
        """Test examples scored (0 without a test set)."""
        return self.test_before.n if self.test_before else 0

    def scores(self, split: str = "dev") -> tuple[DevScore | None, DevScore | None]:
        """(before, after) of ``split``: "dev" or "test" (None, None without a test set)."""
        return (self.before, self.after) if split == "dev" else (self.test_before, self.test_after)

    def paired(self, split: str = "dev") -> dict[str, Any] | None:
        """After vs before on the same ``split`` ("dev" or "test") examples (``eval.metrics.paired_compare``:
        mean difference after − before with its paired bootstrap 95% CI; wins/losses and exact McNemar p when the
        scores are 0/1); None when the per-example scores do not pair (different lengths, none)."""
        before, after = self.scores(split)
        return _paired(before.scores, after.scores) if before and after else None

    def paired_parts(self, split: str = "dev") -> dict[str, dict[str, Any]]:
        """``paired`` per metric part (``{"judge": ..., "f1": ...}`` for the answer stage), same examples."""
        before, after = self.scores(split)
        if before is None or after is None:
            return {}
        pairs = {k: _paired(v, after.parts.get(k, [])) for k, v in before.parts.items()}
        return {k: p for k, p in pairs.items() if p is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "n_train": self.n_train, "n_dev": self.n_dev, "n_test": self.n_test,
                "before": self.before.model_dump(), "after": self.after.model_dump(),
                "test_before": self.test_before.model_dump() if self.test_before else None,
                "test_after": self.test_after.model_dump() if self.test_after else None,
                "changes": self.changes, "cost": self.cost, "seconds": round(self.seconds, 1),
                "by_category": self.by_category, "paired": self.paired(), "paired_test": self.paired("test"),
                "paired_parts": self.paired_parts(), "paired_parts_test": self.paired_parts("test"),
                "calls_on_train": self.calls_on_train}


def _paired(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """``eval.metrics.paired_compare(a, b)``, or None when the per-example scores do not pair (none, lengths differ)."""
    from nemori_dspy.eval.metrics import paired_compare

    return paired_compare(a, b) if a and len(a) == len(b) else None


def _categories(dev: list[dspy.Example], before: DevScore, after: DevScore) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    cats = [getattr(ex, "category", None) for ex in dev]
    for cat in sorted({c for c in cats if c is not None}):
        idx = [i for i, c in enumerate(cats) if c == cat]
        name = CATEGORY_NAMES.get(cat, str(cat))
        out[name] = {"n": len(idx), "before": mean_ci95([before.scores[i] for i in idx])[0],
                     "after": mean_ci95([after.scores[i] for i in idx])[0]}
    return out


def _say(opts: OptimizeOptions, text: str) -> None:
    if opts.progress:
        print(text, flush=True)


def _usage_delta(before: dict[str, Usage], after: dict[str, Usage]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, u in after.items():
        b = before.get(name, Usage())
        d = {k: getattr(u, k) - getattr(b, k) for k in ("calls", "cache_hits", "failures", "input_tokens",
                                                         "output_tokens", "seconds", "cost_usd")}
        if any(d.values()):
            out[name] = d
    return out


def optimize_stage(stage: str, memory: Memory, records_path: Path, opts: OptimizeOptions) -> StageResult:
    """Tune one stage: examples → dev before → compile on train → dev after → written into ``memory.pipeline``.

    The result's ``cost`` is this stage's own (a ledger active only while it is tuned).

    Raises:
        ConfigError: no train or no dev examples (e.g. the slice holds no labelled episode).
    """
    spent = UsageLedger()
    with spent.charging():
        return _optimize_stage(stage, memory, records_path, opts, spent)


def _optimize_stage(stage: str, memory: Memory, records_path: Path, opts: OptimizeOptions,
                    spent: UsageLedger) -> StageResult:
    t0 = time.perf_counter()
    if stage in ("answer", "partition") or opts.from_sessions(stage):  # no records needed
        records, calls = [], {}
    else:
        records = read_records(records_path)
        calls = check_stage_ran(stage, records, [c.sample_id for c in opts.train])
    program, metric, (train, dev, test) = _program_metric_examples(stage, memory, records, opts)
    if opts.max_train and len(train) > opts.max_train:
        train = random.Random(opts.budget.seed).sample(train, opts.max_train)
    if not train or not dev:
        raise ConfigError(f"stage {stage!r}: {len(train)} train / {len(dev)} dev examples. Fix: widen --sessions or "
                          "pick conversations whose questions' evidence lies in the slice.")
    if opts.test and not test:
        _say(opts, f"[{stage}] no test examples (no labelled example in the test conversations); test is not scored")
    state0 = program.dump_state()
    _say(opts, f"[{stage}] {len(train)} train / {len(dev)} dev / {len(test)} test examples; scoring before tuning …")
    before = score_program(program, dev, metric, opts.budget.num_threads)
    test_before = score_program(program, test, metric, opts.budget.num_threads) if test else None
    _say(opts, f"[{stage}] dev before: {before.cell()}" + (f"; test before: {test_before.cell()}" if test_before
                                                           else "") + f"; compiling with {opts.optimizer} …")
    _checkpoint(opts.out_dir, stage, {"stage": stage, "before": before.model_dump(), "status": "compiling"})
    tuner = make_optimizer(opts.optimizer, metric, opts.budget, prompt_model=opts.reflection_lm,
                           **({"log_dir": str(opts.out_dir / f"gepa-{stage}")} if opts.optimizer == "gepa" else {}))
    compiled = tuner.compile(program, train, valset=dev)  # MIPROv2 / GEPA select on dev; test stays unseen
    refused = getattr(tuner.teleprompter, "refused", 0)
    if refused:
        _say(opts, f"[{stage}] {refused} proposed instruction(s) refused: they speak about prompting, not the task")
    for name in keep_task_instructions(compiled, program):
        _say(opts, f"[{stage}] {name}: the tuned instruction speaks about prompting, not the task; the default kept")
    after = score_program(compiled, dev, metric, opts.budget.num_threads)
    test_after = score_program(compiled, test, metric, opts.budget.num_threads) if test else None
    _say(opts, f"[{stage}] dev after:  {after.cell()}" + (f"; test after: {test_after.cell()}" if test_after else ""))
    compiled.apply_to(memory.pipeline)
    result = StageResult(stage=stage, n_train=len(train), n_dev=len(dev), before=before, after=after,
                         changes=program_changes(state0, compiled.dump_state()),
                         cost=_usage_delta({}, spent.snapshot()), seconds=time.perf_counter() - t0,
                         by_category=_categories(test or dev, test_before or before, test_after or after),
                         test_before=test_before, test_after=test_after, calls_on_train=calls)
    _checkpoint(opts.out_dir, stage, {**result.to_dict(), "status": "done"})
    return result


def _program_metric_examples(stage: str, memory: Memory, records: list[StageRecord], opts: OptimizeOptions
                             ) -> tuple[StageProgram, Callable[..., Any], tuple[list, list, list]]:
    """(program, metric, (train, dev, test examples)) of one stage in the run's metric mode."""
    if opts.metric == "end-to-end":
        program: StageProgram = EndToEndProgram(
            memory.pipeline, tuple(stage.split("+")), {c.sample_id: c for c in [*opts.train, *opts.dev, *opts.test]},
            memory.embedder, memory.settings)
        return program, end_to_end_metric, tuple(_e2e_examples(x) for x in (opts.train, opts.dev, opts.test))
    if stage == "consolidate":
        splits: tuple[list, list, list] = (consolidate_examples("a"), consolidate_examples("b"),
                                           consolidate_examples("c") if opts.test else [])
    elif opts.from_sessions(stage):
        splits = tuple(narrate_session_examples(x, memory.settings) if x else []
                       for x in (opts.train, opts.dev, opts.test))
    else:
        splits = tuple(stage_examples(stage, memory, records, x) if x else [] for x in (opts.train, opts.dev, opts.test))
    return stage_program(stage, memory.pipeline), stage_metric(stage, opts.answer_metric, memory.embedder), splits


def _e2e_examples(conversations: list[LoCoMoConversation]) -> list[dspy.Example]:
    """One end-to-end example per conversation: input ``sample_id``, labels its scored questions' gold answers."""
    return [dspy.Example(sample_id=c.sample_id, gold_answers=[q.answer for q in end_to_end_questions(c)])
            .with_inputs("sample_id") for c in conversations if end_to_end_questions(c)]


def _checkpoint(out_dir: Path, stage: str, data: dict[str, Any]) -> None:
    """``<out>/stage-<name>.json``: what an interrupted run had reached (written atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"stage-{stage.replace('+', '_')}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def run_optimize(memory: Memory, records_path: Path, opts: OptimizeOptions) -> list[StageResult]:
    """Tune ``opts.stages`` in pipeline order on an already built memory (see ``ensure_built``); saves
    ``program.json`` (the whole pipeline state, tuned stages included) and ``result.json`` in ``opts.out_dir``.

    Raises:
        ConfigError: train, dev and test share a conversation, a construction stage has no recorded call on
            train (``check_stage_ran``), or a stage has no examples.
    """
    check_split([c.sample_id for c in opts.train], [c.sample_id for c in opts.dev], [c.sample_id for c in opts.test])
    results = []
    for stage in opts.stages:
        tuned_before = [r.stage for r in results if r.stage != "answer"]
        if tuned_before and stage != "answer" and opts.metric == "stage":
            _say(opts, f"[{stage}] note: its examples are the records of the memory built before "
                       f"{', '.join(tuned_before)} was tuned (a trial re-runs one stage call; --metric end-to-end "
                       "rebuilds memory per candidate)")
        if tuned_before and stage == "answer":
            _say(opts, f"[answer] note: contexts come from the memory built before {', '.join(tuned_before)} was "
                       "tuned; run eval locomo --program on the result to score the rebuilt memory")
        results.append(optimize_stage(stage, memory, records_path, opts))
        memory.pipeline.save(str(opts.out_dir / "program.json"))
    (opts.out_dir / "result.json").write_text(json.dumps([r.to_dict() for r in results], indent=1, default=str))
    return results


def ensure_built(memory: Memory, conversations: list[LoCoMoConversation], records_path: Path,
                 is_built: Callable[[str], bool], mark_built: Callable[[str], None], progress: bool = True) -> list[str]:
    """Build each conversation's memory (recording stage calls) unless it is built *and* recorded.

    A conversation built before stage records existed is rebuilt (its user deleted first), so every stage
    example comes from the memory it describes. Returns the sample ids built now.
    """
    from nemori_dspy.eval.runner import ingest_conversation
    from nemori_dspy.recording import recording

    recorded = {r.meta.get("user_id") for r in read_records(records_path)}
    built = []
    for conv in conversations:
        if is_built(conv.sample_id) and conv.sample_id in recorded:
            continue
        if memory.store.user_exists(conv.sample_id):
            memory.store.delete_user(conv.sample_id)
        with recording(records_path):
            ing = ingest_conversation(memory, conv, progress)
        if ing["parked"]:
            raise ConfigError(f"{conv.sample_id}: memory construction parked work ({ing['parked'][:2]}). Fix: rerun "
                              "(parked work is retried) or use a stronger model.")
        mark_built(conv.sample_id)
        built.append(conv.sample_id)
    return built
