"""Signatures of response generation (§3.4, P_ans) and the LoCoMo LLM judge (Appendix D.4.1).

Our reconstructions: the paper names these prompts (Appendix D.3, D.4.1) without their text.
The judge follows mem0's LoCoMo judge rules as summarised in shared/data/locomo/README.md;
``JudgeAnswerStrict`` is our stricter counterpart (published LoCoMo scores move from 91% to 35% between
judge prompts, so a run can report both).
"""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = ["AnswerQuestion", "JudgeAnswer", "JudgeAnswerStrict"]


class AnswerQuestion(dspy.Signature):
    """Answer a question about the user's past conversations from retrieved memories (P_ans, §3.4, Appendix D.3).

    The context holds episode narratives, raw messages with timestamps and known facts. Ground the answer
    in it; when memories disagree prefer the most recent. For time questions give absolute dates,
    computing them from timestamps when a message says "yesterday" or "last week". Answer in a short
    phrase (a few words), not a sentence. If the context is empty, answer from general knowledge."""

    context: str = dspy.InputField(desc="retrieved memories; may be empty")
    question: str = dspy.InputField(desc="the question to answer")
    answer: str = dspy.OutputField(desc="short answer phrase, e.g. '11 March 2021' or 'chess and hiking'")


class JudgeAnswer(dspy.Signature):
    """Label a generated answer CORRECT or WRONG against the gold answer (LoCoMo LLM judge, Appendix D.4.1).

    Be generous: the answer is CORRECT if it touches on the same topic and facts as the gold answer, even
    if longer or worded differently. For time questions it is CORRECT if it refers to the same date or
    time period, even in another format or relative wording ("May 7th" vs "7 May"). Otherwise WRONG."""

    question: str = dspy.InputField(desc="the question")
    gold_answer: str = dspy.InputField(desc="the reference answer")
    generated_answer: str = dspy.InputField(desc="the answer to grade")
    reasoning: str = dspy.OutputField(desc="one short sentence of reasoning")
    label: Literal["CORRECT", "WRONG"] = dspy.OutputField(desc="CORRECT or WRONG")


class JudgeAnswerStrict(dspy.Signature):
    """Label a generated answer CORRECT or WRONG against the gold answer, strictly (our stricter LoCoMo judge).

    The key facts of the gold answer are the names, places, numbers, items and dates that answer the question.
    The answer is CORRECT only if it states every key fact and says nothing that contradicts the gold answer.
    Sharing the topic is not enough: a different or missing name, place, number or item is WRONG. Dates must
    match at the gold answer's precision: a gold day needs that same day, a gold month that month (and year),
    a gold year that year; a vaguer or a different date is WRONG, the same date in another format is fine.
    Extra detail that does not contradict the gold answer is allowed."""

    question: str = dspy.InputField(desc="the question")
    gold_answer: str = dspy.InputField(desc="the reference answer")
    generated_answer: str = dspy.InputField(desc="the answer to grade")
    key_facts_present: bool = dspy.OutputField(desc="true only if the answer states every key fact of the gold answer")
    contradicts_gold: bool = dspy.OutputField(desc="true if anything in the answer contradicts the gold answer")
    label: Literal["CORRECT", "WRONG"] = dspy.OutputField(
        desc="CORRECT only if key_facts_present is true and contradicts_gold is false, else WRONG")
