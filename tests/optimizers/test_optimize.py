"""Guards on what an optimizer may keep (``optimizers.optimize``): no instruction about prompting instead of the task."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.optimizers.optimize import (GuardedMIPROv2, is_meta_instruction, keep_task_instructions, make_optimizer,
                                             summary_batch_size)
from nemori_dspy.signatures import SIGNATURES
from nemori_dspy.eval.metrics import f1_metric

META = [
    "Create a new instruction that will prompt the Language Model to solve the given task efficiently and effectively.",
    "To prompt a Language Model to answer questions about past conversations, use the instruction `Answer a question`.",
]


@pytest.mark.parametrize("text", META)
def test_an_instruction_about_prompting_is_meta(text):
    assert is_meta_instruction(text)


@pytest.mark.parametrize("stage", sorted(SIGNATURES))
def test_no_instruction_of_ours_is_meta(stage):
    assert not is_meta_instruction(SIGNATURES[stage].instructions)


def test_mipro_never_tries_a_meta_proposal(monkeypatch):
    proposed = {0: ["the default instruction", META[0], "Answer in a short phrase from the memories."]}
    monkeypatch.setattr(dspy.MIPROv2, "_propose_instructions", lambda self, program, *a, **k: dict(proposed))
    with dspy.context(lm=dspy.LM("openai/never-called")):
        tp = make_optimizer("mipro", f1_metric).teleprompter
    assert isinstance(tp, GuardedMIPROv2)
    kept = tp._propose_instructions(None)
    assert kept == {0: ["the default instruction", "Answer in a short phrase from the memories."]}
    assert tp.refused == 1


def test_a_tuned_meta_instruction_gives_way_to_the_default():
    student = dspy.Predict(SIGNATURES["answer"])
    tuned = student.deepcopy()
    tuned.signature = tuned.signature.with_instructions(META[0])
    tuned.demos = [dspy.Example(context="c", question="q", answer="a")]
    assert keep_task_instructions(tuned, student) == ["self"]
    assert tuned.signature.instructions == SIGNATURES["answer"].instructions and len(tuned.demos) == 1
    assert keep_task_instructions(tuned, student) == []                     # a task instruction is left alone


def test_the_dataset_summary_shows_only_as_many_examples_as_fit_the_proposers_context(monkeypatch, caplog):
    """Ten answer examples with ~2,000-token contexts overflowed the 1.5B's 8,192 tokens: two fit a call, too few
    for a summary worth reading the whole train set, so it is off with a warning; short examples keep it, ten a call."""
    long = [dspy.Example(context="word " * 1600, question="q", answer="a").with_inputs("context", "question")] * 12
    short = [dspy.Example(context="c", question="q", answer="a").with_inputs("context", "question")] * 12
    assert summary_batch_size(long) == 2 and summary_batch_size(short) == 10 and summary_batch_size([]) == 10
    seen = {}
    monkeypatch.setattr(dspy.MIPROv2, "compile", lambda self, student, **kw: seen.update(kw) or student)
    with dspy.context(lm=dspy.LM("openai/never-called")):
        tp = make_optimizer("mipro", f1_metric).teleprompter
    tp.compile(dspy.Predict(SIGNATURES["answer"]), trainset=long)
    assert seen["view_data_batch_size"] == 2 and seen["data_aware_proposer"] is False
    assert "dataset summary is off" in caplog.text
    seen.clear()
    tp.compile(dspy.Predict(SIGNATURES["answer"]), trainset=short)
    assert seen["view_data_batch_size"] == 10 and "data_aware_proposer" not in seen
    seen.clear()
    tp.compile(dspy.Predict(SIGNATURES["answer"]), trainset=long, data_aware_proposer=True)
    assert seen["data_aware_proposer"] is True and "view_data_batch_size" not in seen  # the caller's choice stands
