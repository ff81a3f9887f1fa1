"""Guards on what an optimizer may keep (``optimizers.optimize``): no instruction about prompting instead of the task."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.optimizers.optimize import GuardedMIPROv2, is_meta_instruction, keep_task_instructions, make_optimizer
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
