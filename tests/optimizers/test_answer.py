"""Answer-stage optimization (optimizers/answer.py) with a scripted LM: no network, no model.

The scripted answerer is demo-aware: it knows the gold answers but only gives them when the
prompt carries few-shot demos (rendered by ChatAdapter as earlier user/assistant turns);
without demos it says "I don't know". So optimization measurably raises the score.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.errors import ConfigError, UnknownUserError
from nemori_dspy.eval.locomo import LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.metrics import f1_metric, token_f1
from nemori_dspy.memory import Memory
from nemori_dspy.modules.pipeline import NemoriPipeline, stage_factory
from nemori_dspy.optimizers import (AnswerProgram, evaluate_answer, locomo_answer_examples, make_optimizer,
                                    optimize_answer)
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Message
from tests.fakes import ScriptedLM, chat_reply, default_responders

USER = "conv-t"
FACTS = [
    ("Alice", "I adopted a cat named Miso last week."),
    ("Bob", "Nice! I started learning the violin."),
    ("Alice", "I moved to Lisbon in March."),
    ("Bob", "My sister Carla visits every summer."),
    ("Alice", "I run a half marathon each October."),
    ("Bob", "I work as a nurse at the city hospital."),
    ("Alice", "My favourite food is ramen."),
    ("Bob", "I painted my kitchen blue."),
    ("Alice", "I bought a red bicycle."),
    ("Bob", "See you at the concert on Friday."),
]
QA = [  # question, gold, category
    ("What is the name of Alice's cat?", "Miso", 4),
    ("Which instrument is Bob learning?", "violin", 4),
    ("Where did Alice move?", "Lisbon", 1),
    ("When does Carla visit Bob?", "every summer", 2),
    ("What is Bob's job?", "nurse", 3),
    ("What colour is Alice's bicycle?", "red", 4),
    ("Did Alice mention a dog?", "", 5),
]
GOLD = {q: a for q, a, _ in QA}


class DemoAwareLM(ScriptedLM):
    """ScriptedLM that also records, per thread, how many demo turns the prompt carried."""

    def __init__(self, responders):
        super().__init__(responders)
        self.local = threading.local()
        self.demo_counts: list[int] = []

    def __call__(self, *args, **kwargs):
        messages = kwargs.get("messages") or []
        self.local.demos = sum(1 for m in messages[:-1] if m.get("role") == "assistant")
        return super().__call__(*args, **kwargs)

    def reply(self, system, user):
        if self.route(system) == "AnswerQuestion":
            self.demo_counts.append(self.local.demos)
        return super().reply(system, user)


def answer_responder(lm_ref: list):
    def answer(inputs):
        lm = lm_ref[0]
        return chat_reply(answer=GOLD[inputs["question"]] if lm.local.demos else "I don't know")
    return answer


@pytest.fixture
def lm():
    ref: list = []
    responders = {**default_responders(), "AnswerQuestion": answer_responder(ref)}
    lm = DemoAwareLM(responders)
    ref.append(lm)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        yield lm


@pytest.fixture
def conv():
    t0 = datetime(2023, 5, 7, 10, 0)
    msgs = [Message(speaker=s, content=c, timestamp=t0 + timedelta(minutes=i), id=f"D1:{i + 1}")
            for i, (s, c) in enumerate(FACTS)]
    qs = [LoCoMoQuestion(sample_id=USER, index=i, question=q, answer=a, category=c)
          for i, (q, a, c) in enumerate(QA)]
    return LoCoMoConversation(sample_id=USER, speaker_a="Alice", speaker_b="Bob", messages=msgs, questions=qs)


@pytest.fixture
def memory(tmp_path, lm, conv):
    store = SQLiteStore(tmp_path / "m.db")
    mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=10))
    mem.add_messages(USER, conv.messages)
    mem.flush(USER)
    yield mem
    store.close()


@pytest.fixture
def examples(memory, conv):
    return locomo_answer_examples(memory, [conv])


def fresh_pipeline(memory) -> NemoriPipeline:
    return NemoriPipeline(memory.resources, stage_factory(memory.settings))


def answer_predictor(pipeline):
    return dict(pipeline.named_predictors())["response.answer.predict"]


# ---------------------------------------------------------------- examples

def test_examples_carry_retrieved_context_and_gold_labels(memory, examples):
    assert len(examples) == 6  # category 5 dropped by default
    ex = next(e for e in examples if e.question == "What is the name of Alice's cat?")
    assert set(ex.inputs().keys()) == {"context", "question"}
    assert set(ex.labels().keys()) == {"answer", "category"}
    assert (ex.answer, ex.category) == ("Miso", 4)
    assert "Miso" in ex.context
    assert ex.context == memory.answer(USER, ex.question).context  # same context as inference


def test_examples_come_in_the_order_of_their_contexts(examples):
    contexts = [e.context for e in examples]  # one conversation: prompts sharing a prefix are scored together
    assert contexts == sorted(contexts) and len(set(contexts)) > 1


def test_examples_filter_categories_and_cap_per_conversation(memory, conv):
    assert [e.category for e in locomo_answer_examples(memory, [conv], categories=(5,))] == [5]
    assert len(locomo_answer_examples(memory, [conv], max_per_conversation=2)) == 2


def test_examples_need_a_built_memory(memory, conv):
    ghost = conv.model_copy(update={"sample_id": "never-added"})
    with pytest.raises(UnknownUserError):
        locomo_answer_examples(memory, [ghost])


# ---------------------------------------------------------------- program

def test_program_shares_the_pipeline_stage_and_answers(memory, examples, lm):
    program = AnswerProgram(memory.pipeline)
    assert program.answer is memory.pipeline.response.answer
    assert [n for n, _ in program.named_predictors()] == ["answer.predict"]
    assert program(**examples[0].inputs()).answer == "I don't know"


def test_evaluate_matches_hand_computed_f1(memory, examples, lm):
    program = AnswerProgram(memory.pipeline)
    score = evaluate_answer(program, examples, f1_metric)
    assert score == 0.0  # "I don't know" shares no token with any gold answer
    # with one demo in the prompt the scripted answerer gives every gold answer verbatim
    answer_predictor(memory.pipeline).demos = [examples[0]]
    score = evaluate_answer(program, examples, f1_metric)
    assert 0.0 <= score <= 1.0 and score == pytest.approx(1.0)
    partial = [e.copy(answer=e.answer + " indeed") for e in examples]  # F1 = 2/3 for one-token golds
    expected = sum(token_f1(e.answer.replace(" indeed", ""), e.answer) for e in partial) / len(partial)
    assert evaluate_answer(program, partial, f1_metric) == pytest.approx(expected)


def test_evaluate_rejects_empty_devset(memory):
    with pytest.raises(ValueError, match="devset is empty"):
        evaluate_answer(AnswerProgram(memory.pipeline), [], f1_metric)


# ---------------------------------------------------------------- optimize

def test_labeled_puts_k_demos_into_the_pipeline_and_raises_the_score(memory, examples, lm):
    before = evaluate_answer(AnswerProgram(memory.pipeline), examples, f1_metric)
    lm.calls.clear()
    program = optimize_answer(memory.pipeline, examples, optimizer="labeled", max_labeled_demos=3)
    assert lm.calls == {}  # LabeledFewShot makes no LM call
    demos = answer_predictor(memory.pipeline).demos
    assert len(demos) == 3 and all(d in examples for d in demos)
    assert program.answer is not memory.pipeline.response.answer  # the optimizer compiled a copy...
    assert dict(program.named_predictors())["answer.predict"].demos == demos  # ...whose state was applied
    after = evaluate_answer(AnswerProgram(memory.pipeline), examples, f1_metric)
    assert (before, after) == (0.0, pytest.approx(1.0))
    assert memory.answer(USER, "Where did Alice move?").answer == "Lisbon"  # the Memory facade sees it


def test_bootstrap_collects_traces_accepted_by_the_metric(memory, examples, lm):
    program = optimize_answer(memory.pipeline, examples, optimizer="bootstrap",
                              max_bootstrapped_demos=2, max_labeled_demos=4)
    demos = answer_predictor(memory.pipeline).demos
    augmented = [d for d in demos if d.get("augmented")]
    assert len(augmented) == 2 and len(demos) == 4  # 2 bootstrapped + 2 labeled fill-ins
    # a bootstrapped demo is the teacher's own (correct) output on a train example
    assert all(d["answer"] == GOLD[d["question"]] and d["context"] for d in augmented)
    assert program._compiled
    assert evaluate_answer(program, examples, f1_metric) == pytest.approx(1.0)


def test_bootstrap_rejects_traces_the_metric_refuses(memory, examples, lm):
    optimize_answer(memory.pipeline, examples, metric=lambda ex, pred, trace=None: False,
                    optimizer="bootstrap", max_bootstrapped_demos=2, max_labeled_demos=3)
    demos = answer_predictor(memory.pipeline).demos
    assert len(demos) == 3 and not any(d.get("augmented") for d in demos)


def test_optimized_demos_round_trip_through_pipeline_save_load(memory, examples, lm, tmp_path):
    optimize_answer(memory.pipeline, examples, optimizer="bootstrap", max_bootstrapped_demos=2,
                    max_labeled_demos=3)
    saved = answer_predictor(memory.pipeline).demos
    memory.pipeline.save(tmp_path / "pipeline.json")
    fresh = fresh_pipeline(memory)
    assert answer_predictor(fresh).demos == []
    fresh.load(tmp_path / "pipeline.json")
    loaded = answer_predictor(fresh).demos
    assert [dict(d) for d in loaded] == [dict(d) for d in saved]
    assert evaluate_answer(AnswerProgram(fresh), examples, f1_metric) == pytest.approx(1.0)


def stage_lm(text: str) -> ScriptedLM:
    return ScriptedLM({**default_responders(), "AnswerQuestion": lambda i: chat_reply(answer=text)})


def test_compiled_copy_still_calls_the_stage_lm(memory, examples, lm):
    own = stage_lm("from the stage LM")
    target = NemoriPipeline(memory.resources, stage_factory(memory.settings, {"answer": own}))
    program = make_optimizer("labeled", f1_metric, max_labeled_demos=2).compile(
        AnswerProgram(target), trainset=examples)
    assert dict(program.named_predictors())["answer.predict"].lm is None  # reset_copy cleared it...
    assert program(**examples[0].inputs()).answer == "from the stage LM"  # ...yet it is still used
    assert own.calls == {"AnswerQuestion": 1} and "AnswerQuestion" not in lm.calls


def test_apply_to_keeps_the_target_lm_and_copies_demos_and_instructions(memory, examples, lm):
    program = make_optimizer("labeled", f1_metric, max_labeled_demos=2).compile(
        AnswerProgram(memory.pipeline), trainset=examples)
    p = dict(program.named_predictors())["answer.predict"]
    p.signature = p.signature.with_instructions("Answer tersely.")
    own = stage_lm("unused")
    other = NemoriPipeline(memory.resources, stage_factory(memory.settings, {"answer": own}))
    assert program.apply_to(other) is other
    q = answer_predictor(other)
    assert q.lm is own and q.demos == p.demos and len(q.demos) == 2
    assert q.signature.instructions == "Answer tersely."
    assert answer_predictor(memory.pipeline).signature.instructions != "Answer tersely."  # source untouched


def test_apply_to_refuses_a_different_predictor_structure(memory, lm):
    cot = NemoriPipeline(memory.resources, stage_factory(memory.settings,
                                                         predictor_classes={"answer": "dspy.ChainOfThought"}))
    with pytest.raises(ConfigError, match="predictors .* differ"):
        AnswerProgram(memory.pipeline).apply_to(cot)


def test_unknown_optimizer_and_empty_trainset(memory, examples):
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimize_answer(memory.pipeline, examples, optimizer="nope")
    with pytest.raises(ValueError, match="trainset is empty"):
        optimize_answer(memory.pipeline, [], optimizer="labeled")


def test_mipro_is_built_light_but_not_run(memory, lm):
    mipro = make_optimizer("mipro", f1_metric, max_bootstrapped_demos=2, max_labeled_demos=3).teleprompter
    assert isinstance(mipro, dspy.MIPROv2) and mipro.auto == "light"
    assert (mipro.max_bootstrapped_demos, mipro.max_labeled_demos) == (2, 3)
