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

import logging
from typing import Any, Callable, Iterable, Sequence

import dspy

from nemori_dspy.errors import UnknownUserError
from nemori_dspy.eval.locomo import SCORED_CATEGORIES, LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.metrics import f1_metric
from nemori_dspy.memory import Memory
from nemori_dspy.modules.pipeline import NemoriPipeline
from nemori_dspy.optimizers.optimize import OPTIMIZERS, Budget, compile_program, make_optimizer
from nemori_dspy.optimizers.programs import StageProgram

__all__ = ["AnswerProgram", "OPTIMIZERS", "evaluate_answer", "locomo_answer_examples", "make_optimizer",
           "optimize_answer"]

log = logging.getLogger(__name__)

Metric = Callable[..., Any]


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
        labels ``answer`` (gold, str) and ``category`` (int), conversation by conversation, each conversation's
        in the order of their contexts: scored one after another (``evaluate_answer``, one thread), prompts that
        share a prefix follow each other, so a local server prefills only where they differ (as ``eval locomo``
        asks its questions).
    Raises:
        UnknownUserError: nothing was ever added for a conversation's ``sample_id``.
    """
    keep = set(categories)
    out: list[dspy.Example] = []
    for conv in conversations:
        _check_built(memory, conv.sample_id)
        qs = [q for q in conv.questions if q.category in keep][:max_per_conversation]
        examples = [_example(_context(memory, conv.sample_id, q.question), q) for q in qs]
        out += sorted(examples, key=lambda e: e.context)  # shared context prefixes one after another
    return out


# ---------------------------------------------------------------- program

class AnswerProgram(StageProgram):
    """``forward(context, question) -> dspy.Prediction(answer=str)``: P_ans alone, for optimizers.

    Wraps ``pipeline.response.answer`` (a ``StagePredict``; its predictor is named ``answer.predict`` here,
    ``response.answer.predict`` in the pipeline). At construction the wrapped stage *is* the pipeline's, so
    ``evaluate_answer(AnswerProgram(pipeline), ...)`` scores the pipeline as it is. Optimizers return copies;
    ``apply_to(pipeline)`` writes one back (see ``StageProgram``). The stage's own LM
    (``stage_lms['answer']``) is used for calls even after an optimizer's ``reset_copy`` cleared it.
    """

    def __init__(self, pipeline: NemoriPipeline) -> None:
        super().__init__(pipeline, ("answer",))

    def forward(self, context: str, question: str) -> dspy.Prediction:
        pred = self.call("answer", context=context, question=question)
        return dspy.Prediction(answer=str(pred.answer).strip())


# ---------------------------------------------------------------- optimize / evaluate

def optimize_answer(pipeline: NemoriPipeline, trainset: list[dspy.Example], metric: Metric = f1_metric,
                    optimizer: str = "bootstrap", max_bootstrapped_demos: int = 4, max_labeled_demos: int = 4,
                    **kw: Any) -> AnswerProgram:
    """Optimize P_ans on ``trainset`` and write the result into ``pipeline.response.answer``.

    Args:
        pipeline: the pipeline whose answer stage is tuned (updated in place; other stages untouched).
        trainset: examples from ``locomo_answer_examples`` (inputs ``context``, ``question``).
        metric: DSPy metric ``(example, pred, trace=None) -> float in [0, 1] or bool``.
        optimizer: one of ``OPTIMIZERS`` (see ``optimize.make_optimizer``).
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
    teleprompter = make_optimizer(optimizer, metric, Budget(max_bootstrapped_demos=max_bootstrapped_demos,
                                                            max_labeled_demos=max_labeled_demos), **kw)
    compiled = compile_program(teleprompter, AnswerProgram(pipeline), trainset)
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
