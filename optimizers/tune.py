"""``nemori-dspy optimize``: tune one or more stages against a LoCoMo slice, held-out dev before/after.

Flow (``run_optimize``): build (or reuse) the slice's memory for the train and dev conversations with the
program as it is, recording every stage call beside it (``recording.py``) → per stage, in pipeline order:
examples from the records (construction stages) or from retrieval (``answer``), split by conversation →
dev score before → compile on train → dev score after → the tuned stage is written into the pipeline →
``program.json`` + ``result.json`` in the run folder, and one MLflow run.

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
from nemori_dspy.optimizers.datasets import check_split, consolidate_examples, distill_examples, narrate_examples
from nemori_dspy.optimizers.metrics import STAGE_METRICS, end_to_end_metric
from nemori_dspy.optimizers.optimize import Budget, DevScore, make_optimizer, score_program
from nemori_dspy.optimizers.programs import (ConsolidateProgram, DistillProgram, EndToEndProgram, NarrateProgram,
                                             StageProgram, end_to_end_questions)
from nemori_dspy.recording import StageRecord, read_records
from nemori_dspy.usage import Usage, UsageLedger

__all__ = ["TUNABLE_STAGES", "OptimizeOptions", "StageResult", "parse_stages", "stage_program", "stage_examples",
           "run_optimize", "program_changes", "REFLECTION_STAGE"]

log = logging.getLogger(__name__)

#: stages ``optimize`` can tune, in pipeline order (``anticipate+distill`` tunes both as one program).
TUNABLE_STAGES = ("narrate", "anticipate", "distill", "anticipate+distill", "consolidate", "answer")
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


def stage_metric(stage: str) -> Callable[..., Any]:
    """The stage's metric (``optimizers.metrics.STAGE_METRICS``)."""
    return STAGE_METRICS["distill" if "distill" in stage or stage == "anticipate" else stage]


def stage_examples(stage: str, memory: Memory, records: list[StageRecord],
                   conversations: list[LoCoMoConversation]) -> list[dspy.Example]:
    """The stage's examples for these conversations (``records`` of the built memory for construction
    stages, retrieval for answer)."""
    if stage == "answer":
        return locomo_answer_examples(memory, conversations)
    if stage == "consolidate":
        raise ConfigError("consolidate examples are the hand-written cases (datasets.CONSOLIDATION_CASES).")
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
    budget: Budget = field(default_factory=Budget)
    reflection_lm: dspy.BaseLM | None = None
    progress: bool = True
    metric: str = "stage"  # or "end-to-end": rebuild each conversation's memory per candidate, score answers
    max_train: int | None = None  # keep at most this many train examples (a seeded sample), None = all


@dataclass
class StageResult:
    """One tuned stage: sizes, dev scores before/after, what changed, cost of optimizing, wall seconds."""

    stage: str
    n_train: int
    n_dev: int
    before: DevScore
    after: DevScore
    changes: dict[str, dict[str, Any]]
    cost: dict[str, dict[str, Any]]
    seconds: float
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)

    def paired(self) -> dict[str, Any] | None:
        """After vs before on the same dev examples (``eval.metrics.paired_compare``: mean difference after −
        before with its paired bootstrap 95% CI; wins/losses and exact McNemar p when the scores are 0/1); None
        when the per-example scores do not pair (different lengths, none)."""
        from nemori_dspy.eval.metrics import paired_compare

        a, b = self.before.scores, self.after.scores
        return paired_compare(a, b) if a and len(a) == len(b) else None

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "n_train": self.n_train, "n_dev": self.n_dev, "before": self.before.model_dump(),
                "after": self.after.model_dump(), "changes": self.changes, "cost": self.cost,
                "seconds": round(self.seconds, 1), "by_category": self.by_category, "paired": self.paired()}


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
    if opts.metric == "end-to-end":
        train, dev = _e2e_examples(opts.train), _e2e_examples(opts.dev)
        metric: Callable[..., Any] = end_to_end_metric
        program: StageProgram = EndToEndProgram(
            memory.pipeline, tuple(stage.split("+")), {c.sample_id: c for c in [*opts.train, *opts.dev]},
            memory.embedder, memory.settings)
    else:
        if stage == "consolidate":
            train, dev = consolidate_examples("a"), consolidate_examples("b")
        else:
            records = read_records(records_path) if stage != "answer" else []
            train = stage_examples(stage, memory, records, opts.train)
            dev = stage_examples(stage, memory, records, opts.dev)
        metric, program = stage_metric(stage), stage_program(stage, memory.pipeline)
    if opts.max_train and len(train) > opts.max_train:
        train = random.Random(opts.budget.seed).sample(train, opts.max_train)
    if not train or not dev:
        raise ConfigError(f"stage {stage!r}: {len(train)} train / {len(dev)} dev examples. Fix: widen --sessions or "
                          "pick conversations whose questions' evidence lies in the slice.")
    state0 = program.dump_state()
    _say(opts, f"[{stage}] {len(train)} train / {len(dev)} dev examples; scoring dev before tuning …")
    before = score_program(program, dev, metric, opts.budget.num_threads)
    _say(opts, f"[{stage}] dev before: {before.cell()}; compiling with {opts.optimizer} …")
    _checkpoint(opts.out_dir, stage, {"stage": stage, "before": before.model_dump(), "status": "compiling"})
    tuner = make_optimizer(opts.optimizer, metric, opts.budget, prompt_model=opts.reflection_lm,
                           **({"log_dir": str(opts.out_dir / f"gepa-{stage}")} if opts.optimizer == "gepa" else {}))
    compiled = tuner.compile(program, train, valset=train)
    after = score_program(compiled, dev, metric, opts.budget.num_threads)
    _say(opts, f"[{stage}] dev after:  {after.cell()}")
    compiled.apply_to(memory.pipeline)
    result = StageResult(stage=stage, n_train=len(train), n_dev=len(dev), before=before, after=after,
                         changes=program_changes(state0, compiled.dump_state()),
                         cost=_usage_delta({}, spent.snapshot()), seconds=time.perf_counter() - t0,
                         by_category=_categories(dev, before, after))
    _checkpoint(opts.out_dir, stage, {**result.to_dict(), "status": "done"})
    return result


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
        ConfigError: train and dev share a conversation, or a stage has no examples.
    """
    check_split([c.sample_id for c in opts.train], [c.sample_id for c in opts.dev])
    results = []
    for stage in opts.stages:
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
