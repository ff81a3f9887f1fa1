"""Tune the answer stage P_ans (``response.answer``) against LoCoMo with DSPy optimizers.

Workflow (memory for the LoCoMo users must already be built, e.g. by ``eval.runner``)::

    train = locomo_answer_examples(memory, train_convs)
    dev = locomo_answer_examples(memory, dev_convs)
    before = evaluate_answer(AnswerProgram(memory.pipeline), dev, f1_metric)
    optimized = optimize_answer(memory.pipeline, train, optimizer="bootstrap")
    after = evaluate_answer(optimized, dev, f1_metric)
    memory.pipeline.save("pipeline.json")        # the answer demos/instructions travel with it

Only the answer stage is tuned: contexts are retrieved once, up front, so the optimizer never
touches the store or the other stages.

How the optimized state reaches the pipeline: every DSPy 3.4.1 optimizer compiles a
``reset_copy()`` (a deep copy with demos *and per-predictor LMs* cleared) of the program it is
given, so the returned program never shares its predictor with the pipeline. ``optimize_answer``
therefore copies the result back with ``AnswerProgram.apply_to(pipeline)``, which keeps the
pipeline predictor's own stage LM.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterable, Sequence

import dspy

from nemori_dspy.errors import UnknownUserError
from nemori_dspy.eval.locomo import SCORED_CATEGORIES, LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.metrics import f1_metric
from nemori_dspy.memory import Memory
from nemori_dspy.modules.pipeline import NemoriPipeline

__all__ = ["AnswerProgram", "OPTIMIZERS", "evaluate_answer", "locomo_answer_examples", "make_optimizer",
           "optimize_answer"]

log = logging.getLogger(__name__)

Metric = Callable[..., Any]

#: Names accepted by ``optimize_answer(optimizer=...)``.
OPTIMIZERS: tuple[str, ...] = ("bootstrap", "labeled", "mipro")


# ---------------------------------------------------------------- data

def _context(memory: Memory, user_id: str, question: str) -> str:
    """The answer context ``Memory.answer`` builds for this question (``ResponseGeneration.context``)."""
    return memory.pipeline.response.context(user_id, question).context


def _example(context: str, q: LoCoMoQuestion) -> dspy.Example:
    return dspy.Example(context=context, question=q.question, answer=q.answer,
                        category=q.category).with_inputs("context", "question")


def _check_built(memory: Memory, user_id: str) -> None:
    if not memory.store.user_exists(user_id):
        raise UnknownUserError(user_id)
    pending = memory.store.stats(user_id).get("pending", 0)
    if pending:
        log.warning("user %s has %d unprocessed messages; flush before building examples", user_id, pending)


def locomo_answer_examples(memory: Memory, conversations: Iterable[LoCoMoConversation],
                           categories: Sequence[int] = SCORED_CATEGORIES,
                           max_per_conversation: int | None = None) -> list[dspy.Example]:
    """One ``dspy.Example`` per LoCoMo question, with the context retrieved from ``memory``.

    The memory of each conversation must already be built under user id ``conv.sample_id``
    (messages added and flushed, as ``eval.runner`` does); this function only retrieves.
    Retrieval makes no LLM call (embedder + store only).

    Args:
        memory: the ``Memory`` holding the conversations.
        conversations: LoCoMo samples (``load_locomo``).
        categories: question categories to keep (default 1-4, the scored ones).
        max_per_conversation: keep at most this many questions per conversation, in file order
            (None = all).
    Returns:
        Examples with inputs ``context`` (str, "" if nothing was retrieved) and ``question``, and
        labels ``answer`` (gold, str) and ``category`` (int), in conversation then question order.
    Raises:
        UnknownUserError: nothing was ever added for a conversation's ``sample_id``.
    """
    keep = set(categories)
    out: list[dspy.Example] = []
    for conv in conversations:
        _check_built(memory, conv.sample_id)
        qs = [q for q in conv.questions if q.category in keep][:max_per_conversation]
        out += [_example(_context(memory, conv.sample_id, q.question), q) for q in qs]
    return out


# ---------------------------------------------------------------- program

class _Shared:
    """Holds a value that ``copy.deepcopy`` (hence ``Module.deepcopy``) passes through by reference."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __deepcopy__(self, memo: dict) -> "_Shared":
        return self


class AnswerProgram(dspy.Module):
    """``forward(context, question) -> dspy.Prediction(answer=str)``: P_ans alone, for optimizers.

    Wraps ``pipeline.response.answer`` (a ``StagePredict``; its predictor is named
    ``answer.predict`` here, ``response.answer.predict`` in the pipeline). At construction the
    wrapped stage *is* the pipeline's, so ``evaluate_answer(AnswerProgram(pipeline), ...)`` scores
    the pipeline as it is. Optimizers return copies; use ``apply_to`` to write one back.

    The stage's own LM (``stage_lms['answer']``) is remembered and used for calls even after an
    optimizer's ``reset_copy`` has cleared it from the predictor; otherwise ``dspy.settings.lm``.
    """

    def __init__(self, pipeline: NemoriPipeline) -> None:
        super().__init__()
        self.answer = pipeline.response.answer
        lms = {p.lm for _, p in self.answer.named_predictors() if p.lm is not None}
        self._stage_lm = _Shared(lms.pop() if len(lms) == 1 else None)

    def forward(self, context: str, question: str) -> dspy.Prediction:
        lm = self._stage_lm.value
        with dspy.context(lm=lm) if lm is not None else contextlib.nullcontext():
            pred = self.answer(context=context, question=question)
        return dspy.Prediction(answer=str(pred.answer).strip())

    def apply_to(self, pipeline: NemoriPipeline) -> NemoriPipeline:
        """Copy this program's demos, instructions and field prefixes into ``pipeline.response.answer``.

        Each target predictor keeps its own LM. A no-op if the program already wraps that stage.

        Returns:
            ``pipeline`` (updated in place).
        Raises:
            ValueError: the two answer stages have different predictor structures (e.g. one uses
                ``dspy.ChainOfThought`` and the other ``dspy.Predict``).
        """
        target = pipeline.response.answer
        if target is self.answer:
            return pipeline
        src, dst = dict(self.answer.named_predictors()), dict(target.named_predictors())
        if src.keys() != dst.keys():
            raise ValueError(f"answer predictors differ: program has {sorted(src)}, pipeline has {sorted(dst)}. "
                             "Fix: build the pipeline with the same predictor class for 'answer'.")
        for name, predictor in dst.items():
            lm = predictor.lm
            predictor.load_state({**src[name].dump_state(json_mode=False), "lm": None})
            predictor.lm = lm
        return pipeline


# ---------------------------------------------------------------- optimize / evaluate

def make_optimizer(name: str, metric: Metric, max_bootstrapped_demos: int = 4, max_labeled_demos: int = 4,
                   **kw: Any) -> Any:
    """A DSPy teleprompter by name; ``kw`` go to its constructor.

    * ``"bootstrap"``: ``dspy.BootstrapFewShot`` — runs a teacher (the program with up to
      ``max_labeled_demos`` labeled demos) on the trainset and keeps up to
      ``max_bootstrapped_demos`` traces the metric accepts, then fills up to
      ``max_labeled_demos`` with labeled examples. With a float metric such as F1 any score > 0
      counts as success unless ``metric_threshold=`` is given.
    * ``"labeled"``: ``dspy.LabeledFewShot(k=max_labeled_demos)`` — random gold demos, no LM calls.
    * ``"mipro"``: ``dspy.MIPROv2(metric, auto="light")`` — also proposes instructions with the
      LM; many LM calls (pass ``auto=`` to override, ``num_threads=`` for parallelism).

    Raises:
        ValueError: unknown ``name``.
    """
    if name == "bootstrap":
        return dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=max_bootstrapped_demos,
                                     max_labeled_demos=max_labeled_demos, **kw)
    if name == "labeled":
        return dspy.LabeledFewShot(k=max_labeled_demos, **kw)
    if name == "mipro":
        kw.setdefault("auto", "light")
        return dspy.MIPROv2(metric, max_bootstrapped_demos=max_bootstrapped_demos,
                            max_labeled_demos=max_labeled_demos, **kw)
    raise ValueError(f"unknown optimizer {name!r}. Fix: use one of {', '.join(OPTIMIZERS)}.")


def optimize_answer(pipeline: NemoriPipeline, trainset: list[dspy.Example], metric: Metric = f1_metric,
                    optimizer: str = "bootstrap", max_bootstrapped_demos: int = 4, max_labeled_demos: int = 4,
                    **kw: Any) -> AnswerProgram:
    """Optimize P_ans on ``trainset`` and write the result into ``pipeline.response.answer``.

    Args:
        pipeline: the pipeline whose answer stage is tuned (updated in place; other stages untouched).
        trainset: examples from ``locomo_answer_examples`` (inputs ``context``, ``question``).
        metric: DSPy metric ``(example, pred, trace=None) -> float in [0, 1] or bool``.
        optimizer: ``"bootstrap"``, ``"labeled"`` or ``"mipro"`` (see ``make_optimizer``).
        max_bootstrapped_demos / max_labeled_demos: demo budgets (demos per prompt ≤ their max).
        **kw: extra constructor arguments of the optimizer (e.g. ``metric_threshold=0.5``).
    Returns:
        The compiled ``AnswerProgram`` (a copy; its state already equals the pipeline's).
        ``pipeline.save(path)`` then persists the demos under ``response.answer.predict``.
    Raises:
        ValueError: empty trainset or unknown optimizer.
        LLMError / provider errors: only if the optimizer's error budget (``max_errors``) runs out.
    """
    if not trainset:
        raise ValueError("trainset is empty. Fix: build examples with locomo_answer_examples first.")
    teleprompter = make_optimizer(optimizer, metric, max_bootstrapped_demos, max_labeled_demos, **kw)
    compiled = teleprompter.compile(AnswerProgram(pipeline), trainset=trainset)
    compiled.apply_to(pipeline)
    return compiled


def evaluate_answer(program: dspy.Module, devset: list[dspy.Example], metric: Metric = f1_metric) -> float:
    """Mean of ``metric`` over ``devset`` with ``dspy.Evaluate`` (one thread, no progress bar).

    DSPy 3.4.1's ``Evaluate`` returns an ``EvaluationResult`` whose ``.score`` is a percentage
    rounded to 2 decimals (0-100); this returns the unrounded mean of the per-example scores in
    ``.results`` instead, in [0, 1] for [0, 1]-valued metrics (bools count 0/1). An example whose
    program call raises scores 0.0 (``Evaluate``'s ``failure_score``).

    Raises:
        ValueError: empty devset.
    """
    if not devset:
        raise ValueError("devset is empty. Fix: pass at least one example.")
    evaluate = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)
    result = evaluate(program)
    return sum(float(score) for *_, score in result.results) / len(devset)
