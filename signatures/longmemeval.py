"""Signatures of the LongMemEval LLM judge: one per distinct upstream judge prompt.

Our reconstructions of the five prompts of upstream ``src/evaluation/evaluate_qa.py``
(``get_anscheck_prompt``), following the per-type semantics summarised in
shared/data/longmemeval/README.md, reworded as DSPy signatures (instruction = docstring, typed
fields). Upstream asks gpt-4o for a bare "yes"/"no" (temperature 0, max_tokens 10); we keep that
output shape (one ``label`` field, no reasoning) so scores stay close to the official judge.

Routing (done by ``nemori_dspy.eval.longmemeval_judge``): abstention questions (id ending in
``_abs``) → ``JudgeLongMemEvalAbstention`` whatever their type; otherwise ``single-session-user``,
``single-session-assistant`` and ``multi-session`` → ``JudgeLongMemEvalDefault``,
``temporal-reasoning`` → ``JudgeLongMemEvalTemporal``, ``knowledge-update`` →
``JudgeLongMemEvalKnowledgeUpdate``, ``single-session-preference`` → ``JudgeLongMemEvalPreference``.
"""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = [
    "JudgeLongMemEvalDefault",
    "JudgeLongMemEvalTemporal",
    "JudgeLongMemEvalKnowledgeUpdate",
    "JudgeLongMemEvalPreference",
    "JudgeLongMemEvalAbstention",
    "LONGMEMEVAL_JUDGE_SIGNATURES",
]

_LABEL_DESC = "yes if the response is correct by the rules above, otherwise no"


class JudgeLongMemEvalDefault(dspy.Signature):
    """Decide whether a model's response answers a memory question correctly, given the correct answer.

    Say yes if the response contains the correct answer, is equivalent to it, or contains all the
    intermediate steps needed to reach it. Say no if it is wrong, missing, or gives only a subset of the
    information the correct answer requires."""

    question: str = dspy.InputField(desc="the question asked about the user's chat history")
    gold_answer: str = dspy.InputField(desc="the correct answer")
    generated_answer: str = dspy.InputField(desc="the model response to grade")
    label: Literal["yes", "no"] = dspy.OutputField(desc=_LABEL_DESC)


class JudgeLongMemEvalTemporal(dspy.Signature):
    """Decide whether a model's response answers a temporal-reasoning question correctly, given the correct answer.

    Say yes if the response contains the correct answer, is equivalent to it, or contains all the
    intermediate steps needed to reach it. Say no if it is wrong, missing, or gives only a subset of the
    information the correct answer requires. Do not penalise off-by-one errors in counts of days, weeks,
    months and similar units: if the correct answer is 18 days, a response of 17 or 19 days is correct."""

    question: str = dspy.InputField(desc="the question about dates, durations or order of events")
    gold_answer: str = dspy.InputField(desc="the correct answer")
    generated_answer: str = dspy.InputField(desc="the model response to grade")
    label: Literal["yes", "no"] = dspy.OutputField(desc=_LABEL_DESC)


class JudgeLongMemEvalKnowledgeUpdate(dspy.Signature):
    """Decide whether a model's response gives the up-to-date answer to a question whose answer changed over time.

    Say yes if the response contains the correct (updated) answer. A response that also mentions older,
    superseded information is still correct, as long as the updated answer is the one it gives as the
    answer. Otherwise say no."""

    question: str = dspy.InputField(desc="the question; the user's information changed during the chat history")
    gold_answer: str = dspy.InputField(desc="the correct, most recent answer")
    generated_answer: str = dspy.InputField(desc="the model response to grade")
    label: Literal["yes", "no"] = dspy.OutputField(desc=_LABEL_DESC)


class JudgeLongMemEvalPreference(dspy.Signature):
    """Decide whether a model's response is personalised as a rubric describes, for a request that should use the user's preferences.

    Say yes if the response satisfies the desired personalised response: it recalls the user's personal
    information and uses it correctly. It need not cover every point of the rubric. Otherwise say no."""

    question: str = dspy.InputField(desc="the user's request")
    rubric: str = dspy.InputField(desc="what a desired personalised response looks like")
    generated_answer: str = dspy.InputField(desc="the model response to grade")
    label: Literal["yes", "no"] = dspy.OutputField(desc=_LABEL_DESC)


class JudgeLongMemEvalAbstention(dspy.Signature):
    """Decide whether a model's response correctly identifies an unanswerable question as unanswerable.

    The chat history does not contain the information the question asks for; the explanation says why.
    Say yes if the response declines to answer because the information is missing or incomplete, or says
    that related information was mentioned but not the information asked for. Say no if it gives an
    answer as though the information were known."""

    question: str = dspy.InputField(desc="the unanswerable question")
    explanation: str = dspy.InputField(desc="why the question cannot be answered from the chat history")
    generated_answer: str = dspy.InputField(desc="the model response to grade")
    label: Literal["yes", "no"] = dspy.OutputField(
        desc="yes if the response identifies the question as unanswerable, otherwise no")


#: routing key → signature: the five LongMemEval judge prompts ("abstention" overrides the type).
LONGMEMEVAL_JUDGE_SIGNATURES: dict[str, type[dspy.Signature]] = {
    "single-session-user": JudgeLongMemEvalDefault,
    "single-session-assistant": JudgeLongMemEvalDefault,
    "multi-session": JudgeLongMemEvalDefault,
    "temporal-reasoning": JudgeLongMemEvalTemporal,
    "knowledge-update": JudgeLongMemEvalKnowledgeUpdate,
    "single-session-preference": JudgeLongMemEvalPreference,
    "abstention": JudgeLongMemEvalAbstention,
}
