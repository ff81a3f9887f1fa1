"""DSPy optimizers by name, with budgets from flags, and scoring of a program on a dev set.

``make_optimizer(name, metric, budget, prompt_model)`` → a ``Tuner`` whose ``compile(program, trainset,
valset)`` runs the teleprompter dspy 3.4 ships under that name:

| name | teleprompter | budget used | prompt / reflection model |
|---|---|---|---|
| ``bootstrap`` | ``BootstrapFewShot`` | demos | teacher (``teacher_settings``) |
| ``labeled`` | ``LabeledFewShot`` | ``max_labeled_demos`` | — (no LM calls) |
| ``mipro`` | ``MIPROv2`` | ``auto`` or ``num_trials`` (+ ``num_candidates``), demos | ``prompt_model`` |
| ``gepa`` | ``GEPA`` | ``auto`` or ``max_metric_calls`` | ``reflection_lm`` |
| ``simba`` | ``SIMBA`` | ``num_trials`` = steps (``auto``: light 4, medium 8, heavy 12), demos | ``prompt_model`` |

So a small student can be taught by a larger model: pass the larger one as ``prompt_model``. A proposed
instruction that talks about prompting instead of doing the task (``is_meta_instruction``) is never tried by MIPROv2
(``GuardedMIPROv2``) and never kept by any optimizer (``keep_task_instructions``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import dspy
from pydantic import BaseModel, Field

from nemori_dspy.eval.metrics import mean_ci95
from nemori_dspy.optimizers.names import OPTIMIZERS

__all__ = ["OPTIMIZERS", "check_available", "Budget", "Tuner", "make_optimizer", "compile_program", "score_program",
           "DevScore", "is_meta_instruction", "GuardedMIPROv2", "keep_task_instructions", "summary_batch_size",
           "SUMMARY_EXAMPLE_TOKENS", "SUMMARY_MIN_EXAMPLES"]

log = logging.getLogger(__name__)

#: words of an instruction about writing prompts, not about the task: the 1.5B proposer's "Create a new instruction
#: that will prompt the Language Model to solve the given task efficiently and effectively." (MIPROv2 selected it
#: for P_ans on dev, 2026-12-07) and the tuning issue's "To prompt a Language Model to answer questions … use the
#: instruction `Answer a question …`". No signature of ours says any of them.
_META_INSTRUCTION = re.compile(
    r"\b(language models?|new instructions?|(the|this|an|following|given) instructions?\b|prompt (the|a|an) "
    r"(language )?model)\b", re.IGNORECASE)


def is_meta_instruction(text: str) -> bool:
    """True if a proposed instruction speaks about prompting a model ("Create a new instruction that will prompt the
    Language Model to …") instead of telling the model the task; such a text is never kept as a stage's instruction."""
    return bool(_META_INSTRUCTION.search(text or ""))


#: Tokens of training examples MIPROv2's dataset summary may show its proposer in one call (``summary_batch_size``):
#: room left in the embedded 1.5B's 8,192-token context for DSPy's instruction and the reply. Ten answer examples
#: (each a ~2,000-token memory context) overflowed it ("Error getting data summary: ContextWindowExceededError").
SUMMARY_EXAMPLE_TOKENS = 5000
#: Fewest examples one dataset-summary call must show for ``GuardedMIPROv2`` to keep the summary on: with fewer, the
#: summary reads every training example at the proposer's prefill speed (answer examples: 12 x ~2,200 tokens, some
#: 6 min of the 1.5B here) to describe a dataset two at a time; it is turned off with a warning instead (DSPy
#: proposed without it anyway once the call overflowed).
SUMMARY_MIN_EXAMPLES = 5


def summary_batch_size(trainset: list[dspy.Example], limit: int = 10, budget_tokens: int = SUMMARY_EXAMPLE_TOKENS) -> int:
    """How many of ``trainset``'s examples one dataset-summary call may show (MIPROv2's ``view_data_batch_size``):
    as many of the longest as fit ``budget_tokens`` at ~4 characters per token of their ``repr`` (what DSPy
    shows), at least 1, at most ``limit`` (DSPy's default 10)."""
    longest = max((len(repr(ex)) for ex in trainset), default=0) / 4
    return max(1, min(limit, int(budget_tokens // max(longest, 1.0))))


class GuardedMIPROv2(dspy.MIPROv2):
    """``dspy.MIPROv2`` that drops meta-instructions (``is_meta_instruction``) from the proposed candidates before its
    search, so a trial is never spent on one and the search cannot select one; the program's own instruction
    (candidate 0) always stays. ``refused`` counts the proposals dropped. Unless the caller sets
    ``view_data_batch_size`` or ``data_aware_proposer``, its dataset summary shows the proposer as many examples per
    call as fit its context (``summary_batch_size``), and is off, with a warning, when fewer than
    ``SUMMARY_MIN_EXAMPLES`` fit."""

    refused: int = 0

    def compile(self, student: dspy.Module, *, trainset: list[dspy.Example], **kwargs: Any) -> dspy.Module:
        if "view_data_batch_size" not in kwargs and "data_aware_proposer" not in kwargs:
            fit = summary_batch_size(trainset)
            kwargs["view_data_batch_size"] = fit
            if fit < SUMMARY_MIN_EXAMPLES and len(trainset) > fit:
                kwargs["data_aware_proposer"] = False
                log.warning("MIPROv2's dataset summary is off: %d of these training examples fit the proposer's "
                            "context per call (fewer than %d). To have it anyway: compile with "
                            "data_aware_proposer=True", fit, SUMMARY_MIN_EXAMPLES)
        return super().compile(student, trainset=trainset, **kwargs)

    def _propose_instructions(self, program: Any, *args: Any, **kwargs: Any) -> dict[int, list[str]]:
        candidates = super()._propose_instructions(program, *args, **kwargs)
        for i, texts in candidates.items():
            kept = [t for j, t in enumerate(texts) if j == 0 or not is_meta_instruction(t)]
            for t in texts:
                if t not in kept:
                    log.warning("MIPROv2 proposal refused (speaks about prompting, not the task): %r", t[:200])
            self.refused += len(texts) - len(kept)
            candidates[i] = kept
        return candidates


def keep_task_instructions(compiled: dspy.Module, original: dspy.Module) -> list[str]:
    """Give back each of ``compiled``'s predictors whose tuned instruction is a meta-instruction
    (``is_meta_instruction``) its instruction in ``original`` (demos kept); returns the predictors' names."""
    before = dict(original.named_predictors())
    restored = []
    for name, pred in compiled.named_predictors():
        if name in before and is_meta_instruction(pred.signature.instructions):
            pred.signature = pred.signature.with_instructions(before[name].signature.instructions)
            restored.append(name)
    return restored

_SIMBA_STEPS = {"light": 4, "medium": 8, "heavy": 12}

Metric = Callable[..., Any]


class Budget(BaseModel):
    """How much an optimizer may spend (CLI: ``--auto``, ``--max-metric-calls``, ``--num-trials``,
    ``--num-threads``, ``--max-demos``). ``None`` lets each optimizer pick its own default (``auto="light"``
    for MIPROv2 and GEPA)."""

    auto: Literal["light", "medium", "heavy"] | None = None
    max_metric_calls: int | None = Field(default=None, ge=1, description="GEPA: metric calls in all")
    num_trials: int | None = Field(default=None, ge=1, description="MIPROv2 trials / SIMBA steps")
    num_candidates: int | None = Field(default=None, ge=1, description="MIPROv2 instruction/demo candidates")
    num_threads: int = Field(default=1, ge=1)
    max_bootstrapped_demos: int = Field(default=4, ge=0)
    max_labeled_demos: int = Field(default=4, ge=0)
    seed: int = 0


@dataclass
class Tuner:
    """A teleprompter plus the compile arguments its budget implies."""

    name: str
    teleprompter: Any
    compile_kw: dict[str, Any] = field(default_factory=dict)

    def compile(self, student: dspy.Module, trainset: list[dspy.Example],
                valset: list[dspy.Example] | None = None) -> dspy.Module:
        """Run the optimizer; returns the compiled copy (the student is not changed)."""
        kw = dict(self.compile_kw)
        if self.name in ("mipro", "gepa") and valset:
            kw["valset"] = valset
        if self.name == "mipro":
            n_val = len(valset or trainset)
            kw.setdefault("minibatch_size", max(1, min(35, n_val // 3 or 1)))  # trials on a third of val
            kw.setdefault("minibatch", n_val > kw["minibatch_size"])
        if self.name == "simba":
            self.teleprompter.bsize = max(1, min(self.teleprompter.bsize, len(trainset)))
        return self.teleprompter.compile(student, trainset=trainset, **kw)


def check_available(name: str) -> None:
    """Fail before any model loads when an optimizer's optional dependency is missing.

    Raises:
        MissingExtraError: ``mipro`` without ``optuna`` (a ``ConfigError``; names ``pip install
            "nemori-dspy[optimize]"``).
    """
    if name == "mipro":
        from nemori_dspy.extras import require

        require("optuna", "--optimizer mipro (MIPROv2's search)", "optimize")


def make_optimizer(name: str, metric: Metric, budget: Budget | None = None, prompt_model: dspy.BaseLM | None = None,
                   max_bootstrapped_demos: int | None = None, max_labeled_demos: int | None = None,
                   **kw: Any) -> Tuner:
    """A ``Tuner`` for optimizer ``name`` (see the module table); ``kw`` go to the teleprompter's constructor.

    Args:
        name: one of ``OPTIMIZERS``.
        metric: DSPy metric ``(example, pred, trace=None, pred_name=None, pred_trace=None)``; GEPA uses the
            feedback text it returns when given ``pred_name`` (``optimizers.metrics``).
        budget: spending limits (default ``Budget()``).
        prompt_model: the proposer / reflection / teacher LM (None = ``dspy.settings.lm``; GEPA needs one).
        max_bootstrapped_demos / max_labeled_demos: shortcuts overriding the budget's demo counts.
    Raises:
        ValueError: unknown ``name``, or GEPA without any reflection LM configured.
    """
    b = (budget or Budget()).model_copy(update={k: v for k, v in (("max_bootstrapped_demos", max_bootstrapped_demos),
                                                                   ("max_labeled_demos", max_labeled_demos))
                                                if v is not None})
    if name == "bootstrap":
        teacher = {"teacher_settings": {"lm": prompt_model}} if prompt_model is not None else {}
        return Tuner(name, dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=b.max_bootstrapped_demos,
                                                 max_labeled_demos=b.max_labeled_demos, **teacher, **kw))
    if name == "labeled":
        return Tuner(name, dspy.LabeledFewShot(k=b.max_labeled_demos, **kw))
    if name == "mipro":
        auto = None if b.num_trials else (b.auto or "light")
        tp = GuardedMIPROv2(metric, prompt_model=prompt_model, auto=auto,
                          num_candidates=(b.num_candidates or 3) if auto is None else None,
                          num_threads=b.num_threads, max_bootstrapped_demos=b.max_bootstrapped_demos,
                          max_labeled_demos=b.max_labeled_demos, seed=b.seed, verbose=False, **kw)
        return Tuner(name, tp, {"num_trials": b.num_trials} if auto is None else {})
    if name == "gepa":
        reflection = prompt_model or dspy.settings.lm
        if reflection is None:
            raise ValueError("GEPA needs a reflection LM. Fix: pass --reflection-model (or prompt_model=).")
        limit = ({"max_metric_calls": b.max_metric_calls} if b.max_metric_calls else {"auto": b.auto or "light"})
        tp = dspy.GEPA(metric=metric, reflection_lm=reflection, num_threads=b.num_threads, seed=b.seed,
                       track_stats=True, **limit, **kw)
        return Tuner(name, tp)
    if name == "simba":
        steps = b.num_trials or _SIMBA_STEPS[b.auto or "light"]
        tp = dspy.SIMBA(metric=metric, max_steps=steps, max_demos=b.max_bootstrapped_demos, prompt_model=prompt_model,
                        num_threads=b.num_threads, num_candidates=kw.pop("num_candidates", 4), **kw)
        return Tuner(name, tp, {"seed": b.seed})
    raise ValueError(f"unknown optimizer {name!r}. Fix: use one of {', '.join(OPTIMIZERS)}.")


def compile_program(tuner: Tuner, program: dspy.Module, trainset: list[dspy.Example],
                    valset: list[dspy.Example] | None = None) -> dspy.Module:
    """``tuner.compile`` (kept as a function for symmetry with ``score_program``)."""
    return tuner.compile(program, trainset, valset)


class DevScore(BaseModel):
    """A program's score on a dev or test set: mean and normal-approximation 95% CI (``eval.metrics.mean_ci95``),
    all in [0, 1], over ``n`` examples; ``scores`` per example in set order; ``parts`` the metric's components
    per example when it has them (``JudgeF1Metric.parts``: ``{"judge": [...], "f1": [...]}``)."""

    mean: float
    low: float
    high: float
    n: int
    scores: list[float]
    parts: dict[str, list[float]] = Field(default_factory=dict)

    def cell(self) -> str:
        """``"42.0 [30.1–53.9] (n=12)"`` (×100, as the eval tables print), then the parts' means
        (``"; judge 50.0, f1 31.2"``) when the metric has parts."""
        head = f"{100 * self.mean:.1f} [{100 * self.low:.1f}–{100 * self.high:.1f}] (n={self.n})"
        means = ", ".join(f"{k} {100 * sum(v) / len(v):.1f}" for k, v in self.parts.items() if v)
        return f"{head}; {means}" if means else head


def _score_of(value: Any) -> float:
    if isinstance(value, dspy.Prediction):
        return float(value.score)
    return float(value)


def score_program(program: dspy.Module, devset: list[dspy.Example], metric: Metric,
                  num_threads: int = 1) -> DevScore:
    """Score ``program`` on ``devset`` with ``dspy.Evaluate`` (a call that raises scores 0).

    Raises:
        ValueError: empty devset.
    """
    if not devset:
        raise ValueError("devset is empty. Fix: pass at least one example (check --dev and --sessions).")
    evaluate = dspy.Evaluate(devset=devset, metric=metric, num_threads=num_threads, display_progress=False,
                             failure_score=0.0)
    result = evaluate(program)
    scores = [_score_of(s) for *_, s in result.results]
    parts: dict[str, list[float]] = {}
    if callable(getattr(metric, "parts", None)):  # e.g. JudgeF1Metric: judge and F1 side by side
        for ex, pred, _ in result.results:
            for name, value in metric.parts(ex, pred).items():
                parts.setdefault(name, []).append(float(value))
    mean, low, high = mean_ci95(scores)
    return DevScore(mean=mean, low=low, high=high, n=len(scores), scores=scores, parts=parts)
