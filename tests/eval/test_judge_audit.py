"""The judge audit: calibration pairs drawn from the data, scored by a scripted judge."""

from __future__ import annotations

import json
from datetime import datetime

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.judge import JudgePanel, LLMJudge
from nemori_dspy.eval.judge_audit import audit_table, evenly_spaced, locomo_audit_pairs, run_audit
from nemori_dspy.eval.locomo import LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.runner import EvalOptions, run_locomo
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Message
from tests.fakes import ScriptedLM, chat_reply, default_responders


def _q(index: int, answer: str, category: int = 4, adversarial: str | None = None, sid: str = "c1") -> LoCoMoQuestion:
    return LoCoMoQuestion(sample_id=sid, index=index, question=f"question {index}?", answer=answer,
                          category=category, evidence=["D1:1"], adversarial_answer=adversarial)


def _conv(questions: list[LoCoMoQuestion], sid: str = "c1") -> LoCoMoConversation:
    msgs = [Message(speaker="Ann", content=f"turn {i}", timestamp=datetime(2023, 5, 1, 10, i), id=f"D1:{i + 1}")
            for i in range(3)]
    return LoCoMoConversation(sample_id=sid, speaker_a="Ann", speaker_b="Bob", messages=msgs, questions=questions)


def test_wrong_answer_is_the_adversarial_one_where_the_item_has_it():
    conv = _conv([_q(0, "Austin", adversarial="Denver"), _q(1, "Boston")])
    (pair, _) = locomo_audit_pairs([conv], (4,), None, 20)
    assert (pair.gold, pair.wrong, pair.wrong_source) == ("Austin", "Denver", "adversarial_answer")
    assert pair.example.question == "question 0?" and pair.example.answer == "Austin"


def test_else_another_gold_of_the_same_conversation_same_category_first_sharing_no_token():
    conv = _conv([
        _q(0, "7 May 2023", category=2),
        _q(1, "hiking", category=4),
        _q(2, "May 2023", category=2),      # shares tokens with q0's gold: never its wrong answer
        _q(3, "12 June 2022", category=2),
        _q(4, "", category=5),              # no gold: never a wrong answer
        _q(5, "Denver", category=4, adversarial="Denver"),  # adversarial equals gold: not usable, falls back
    ])
    pairs = {p.index: p for p in locomo_audit_pairs([conv], (1, 2, 3, 4), None, 20)}
    assert pairs[0].wrong == "12 June 2022" and pairs[0].wrong_source == "gold of c1#3"
    assert pairs[1].wrong == "Denver"  # next category-4 gold after index 1
    assert pairs[5].wrong == "hiking"  # wraps around, same category first
    assert 4 not in pairs  # category 5 is not scored
    # deterministic: the same data gives the same set
    assert locomo_audit_pairs([conv], (1, 2, 3, 4), None, 20) == list(pairs.values())
    # other conversations never lend their answers
    lonely = _conv([_q(0, "Austin", sid="c2")], sid="c2")
    assert locomo_audit_pairs([lonely, conv], (4,), None, 20)[0].sample_id == "c1"


def test_size_is_capped_evenly_over_the_scored_questions_and_0_turns_it_off():
    conv = _conv([_q(i, f"answer{i}") for i in range(10)])
    assert [p.index for p in locomo_audit_pairs([conv], (4,), None, 3)] == [0, 3, 6]
    assert [p.index for p in locomo_audit_pairs([conv], (4,), 4, 20)] == [0, 1, 2, 3]  # --max-questions applies
    assert locomo_audit_pairs([conv], (4,), None, 0) == []
    assert evenly_spaced([1, 2], 5) == [1, 2]


def _judge_lm(correct_if):
    return ScriptedLM({"JudgeAnswer": lambda i: chat_reply(
        reasoning="r", label="CORRECT" if correct_if(i["gold_answer"], i["generated_answer"]) else "WRONG")})


def test_accuracy_on_gold_on_wrong_and_overall_with_n(tmp_path):
    conv = _conv([_q(0, "Austin", adversarial="Denver"), _q(1, "Boston"), _q(2, "Chicago")])
    pairs = locomo_audit_pairs([conv], (4,), None, 20)
    # a lenient judge: CORRECT for anything that is a capitalised city, i.e. always
    with dspy.context(lm=_judge_lm(lambda g, a: True), adapter=dspy.ChatAdapter()):
        audit = run_audit({"judge": LLMJudge()}, pairs, tmp_path / "audit.jsonl")
    assert audit == {"judge": {"on_gold": 1.0, "on_wrong": 0.0, "overall": 0.5, "n_gold": 3, "n_wrong": 3, "n": 6}}
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert lines[0] == {**lines[0], "judge": "judge", "gold": "Austin", "wrong": "Denver",
                        "gold_judged_correct": True, "wrong_judged_wrong": False}
    # an exact-match judge gets everything right
    with dspy.context(lm=_judge_lm(lambda g, a: g == a), adapter=dspy.ChatAdapter()):
        audit = run_audit({"judge": LLMJudge()}, pairs)
    assert (audit["judge"]["on_gold"], audit["judge"]["on_wrong"], audit["judge"]["overall"]) == (1.0, 1.0, 1.0)
    table = audit_table(audit)
    assert "gold → CORRECT" in table and "100.0 (n=3)" in table and "100.0 (n=6)" in table


def test_a_failing_judge_call_counts_as_WRONG_on_gold(tmp_path):
    pairs = locomo_audit_pairs([_conv([_q(0, "Austin"), _q(1, "Boston")])], (4,), None, 20)
    with dspy.context(lm=ScriptedLM({"JudgeAnswer": lambda i: "no fields"}), adapter=dspy.ChatAdapter()):
        judge = LLMJudge(parse_retries=0)
        audit = run_audit({"judge": judge}, pairs)
    assert audit["judge"]["on_gold"] == 0.0 and audit["judge"]["on_wrong"] == 1.0 and judge.failures == 4


def test_a_verdict_refused_for_rate_limits_is_left_out_not_counted_wrong(tmp_path, ledger):
    from dspy import lm15

    def judge(i):
        if i["generated_answer"] == i["gold_answer"] == "Austin":  # pair 1's gold verdict: refused, every time
            raise lm15.RateLimitError("429 too many requests")
        return chat_reply(reasoning="r", label="CORRECT" if i["generated_answer"] == i["gold_answer"] else "WRONG")

    pairs = locomo_audit_pairs([_conv([_q(0, "Austin"), _q(1, "Boston")])], (4,), None, 20)
    with dspy.context(lm=ScriptedLM({"JudgeAnswer": judge}), adapter=dspy.ChatAdapter()):
        audit = run_audit({"judge": LLMJudge(parse_retries=0)}, pairs, tmp_path / "audit.jsonl")
    assert audit["judge"] == {"on_gold": 1.0, "on_wrong": 1.0, "overall": 1.0, "n_gold": 1, "n_wrong": 2, "n": 3}
    assert ledger.counters["judge_audit_rate_limited"] == 1
    first = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    assert first["gold_judged_correct"] is None and first["wrong_judged_wrong"] is True


def test_run_locomo_reports_the_audit_beside_the_scores(tmp_path):
    conv = _conv([_q(0, "Austin", adversarial="Denver"), _q(1, "Boston"), _q(2, "7 May 2023", category=2)])
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        panel = JudgePanel({"judge": LLMJudge()}, locomo_audit_pairs([conv], (1, 2, 3, 4), None, 2))
        summary = run_locomo(mem, [conv], EvalOptions(progress=False, systems=[SYSTEMS["nemori"]]), panel,
                             tmp_path / "run")
    # the scripted judge says CORRECT when the answer is inside the gold: gold → CORRECT, "Denver" → WRONG
    assert summary.judge_audit["judge"].model_dump() == {"on_gold": 1.0, "on_wrong": 1.0, "overall": 1.0,
                                               "n_gold": 2, "n_wrong": 2, "n": 4}
    assert json.loads((tmp_path / "run/summary.json").read_text())["judge_audit"] == summary.judge_audit_dicts()
    assert "Judge audit" in (tmp_path / "run/tables.md").read_text()
    assert len((tmp_path / "run/judge_audit.jsonl").read_text().splitlines()) == 2
    assert summary.judges["judge"].prompt_hash == summary.judge.prompt_hash


def test_no_pairs_no_audit(tmp_path):
    conv = _conv([_q(0, "Austin")])  # nothing to borrow a wrong answer from
    assert locomo_audit_pairs([conv], (4,), None, 20) == []
    assert JudgePanel({"judge": object()}).run_audit() is None


@pytest.mark.parametrize("bad", ["-1", "x"])
def test_judge_audit_setting_is_validated(bad):
    from nemori_dspy.config import load_settings
    from nemori_dspy.errors import ConfigError

    with pytest.raises(ConfigError, match="judge_audit"):
        load_settings(judge_audit=bad)
