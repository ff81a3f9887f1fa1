"""The LoCoMo judges: the generous and the strict prompt side by side, through the real adapter."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.eval.judge import (
    JUDGE_METRICS,
    JUDGE_PROMPT_HASH,
    JUDGE_STRICT_PROMPT_HASH,
    JudgePanel,
    LLMJudge,
    as_panel,
    known_wrong,
)
from nemori_dspy.signatures import SIGNATURES, JudgeAnswerStrict, signature_hash
from tests.fakes import ScriptedLM, chat_reply, default_responders

EX = dspy.Example(question="When did she move?", answer="7 March 2022")


@pytest.fixture
def lm():
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        yield lm


def test_strict_judge_has_its_own_prompt_stage_and_hash(lm, ledger):
    strict, generous = LLMJudge(strict=True), LLMJudge()
    assert SIGNATURES["judge_strict"] is JudgeAnswerStrict
    assert strict.prompt_hash == JUDGE_STRICT_PROMPT_HASH == signature_hash(JudgeAnswerStrict) != JUDGE_PROMPT_HASH
    assert generous.prompt_hash == JUDGE_PROMPT_HASH
    # "March 2022" for "7 March 2022": the generous judge passes it, the strict one (date precision) does not
    assert generous(EX, dspy.Prediction(answer="March 2022")) == 1.0
    assert strict(EX, dspy.Prediction(answer="March 2022")) == 0.0
    assert strict(EX, dspy.Prediction(answer="7 March 2022")) == 1.0
    assert [name for name, _ in lm.prompts] == ["JudgeAnswer", "JudgeAnswerStrict", "JudgeAnswerStrict"]
    assert ledger.snapshot()["judge_strict"].calls == 2 and ledger.snapshot()["judge"].calls == 1


@pytest.mark.parametrize("facts,contradicts", [(False, False), (True, True)])
def test_strict_CORRECT_stands_only_with_its_own_findings(facts, contradicts, ledger):
    lm = ScriptedLM({"JudgeAnswerStrict": lambda i: chat_reply(
        key_facts_present=facts, contradicts_gold=contradicts, label="CORRECT")})
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        before = ledger.counters.get("judge_strict_overrides", 0)
        assert LLMJudge(strict=True)(EX, dspy.Prediction(answer="in 2022")) == 0.0
    assert ledger.counters["judge_strict_overrides"] == before + 1


def test_panel_scores_every_judge_and_reports_their_hashes(lm):
    panel = JudgePanel({name: LLMJudge(strict=name == "judge_strict") for name in JUDGE_METRICS["both"]})
    assert panel.metrics == ["judge", "judge_strict"]
    assert panel.score(EX, "March 2022") == {"judge": 1.0, "judge_strict": 0.0}
    info = panel.info()
    assert info["judge"]["prompt_hash"] == JUDGE_PROMPT_HASH
    assert info["judge_strict"]["prompt_hash"] == JUDGE_STRICT_PROMPT_HASH
    single = LLMJudge()
    assert as_panel(single).judges == {"judge": single} and as_panel(None) is None and as_panel(panel) is panel


def test_strict_signature_states_its_rules():
    text = JudgeAnswerStrict.instructions.lower()
    assert "every key fact" in text and "contradict" in text and "precision" in text
    assert set(JudgeAnswerStrict.output_fields) == {"key_facts_present", "contradicts_gold", "label"}


def test_an_empty_answer_or_the_question_restated_is_wrong_without_a_judge_call(ledger):
    """A lenient model judge (the 1.5B) calls both CORRECT: they never reach it."""
    lm = ScriptedLM({"JudgeAnswer": lambda i: chat_reply(reasoning="close enough", label="CORRECT")})
    q = dspy.Example(question="What did Sam agree to try instead of soda and candy?", answer="flavored seltzer water")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        judge = LLMJudge()
        empty = judge.assess(q, dspy.Prediction(answer="  "))
        echo = judge.assess(q, dspy.Prediction(answer="Sam agreed to try instead of soda and candy."))
        assert (empty.label, empty.rule, echo.label, echo.rule) == ("WRONG", "empty", "WRONG", "restates_question")
        assert lm.prompts == [] and judge(q, dspy.Prediction(answer="seltzer water")) == 1.0
    assert ledger.counters["judge_known_wrong.empty"] >= 1 and ledger.counters["judge_known_wrong.restates_question"] >= 1


@pytest.mark.parametrize("question,gold,answer", [
    ("Which would Evan prefer, walking tours in a city or a camping trip?", "camping trip", "a camping trip"),
    ("What type of car did Evan get after his old Prius broke down?", "new Prius", "Prius"),
    ("Did Sam quit the bakery?", "No, he stayed", "No"),
    ("How many Prius has Evan owned?", "two", "2 of them"),
])
def test_answers_the_question_itself_holds_or_one_word_answers_go_to_the_model(question, gold, answer):
    assert known_wrong(question, gold, answer) is None
