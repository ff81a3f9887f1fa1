"""The LongMemEval harness end to end with a scripted LM, on a file in the official schema written here."""

from __future__ import annotations

import copy
import json

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.judge import JudgePanel
from nemori_dspy.eval.judge_audit import longmemeval_audit_pairs
from nemori_dspy.eval.longmemeval import load_longmemeval
from nemori_dspy.eval.longmemeval_judge import LongMemEvalJudge
from nemori_dspy.eval.longmemeval_runner import dated_question, run_longmemeval
from nemori_dspy.eval.runner import EvalOptions
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import LongMemEvalLM, chat_reply, default_responders, lme_responders
from tests.fakes import longmemeval_file as official_file


@pytest.mark.parametrize("concurrency", [1, 3])  # 3: built, answered and judged in threads, same results
def test_one_memory_per_question_per_type_judges_tables_and_audit(tmp_path, concurrency):
    qs = load_longmemeval(official_file(tmp_path))
    lm = LongMemEvalLM(lme_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        panel = JudgePanel({"judge": LongMemEvalJudge()}, longmemeval_audit_pairs(qs, 20))
        opts = EvalOptions(progress=False, systems=[SYSTEMS["nemori"], SYSTEMS["no-memory"]], concurrency=concurrency)
        summary = run_longmemeval(mem, qs, opts, panel, tmp_path / "run")
    # every question has its own memory: its episodes hold exactly its own turns
    for q in qs:
        assert {m for ep in mem.list_episodes(q.question_id) for m in ep.message_ids} == {m.id for m in q.messages}
    rows = [json.loads(x) for x in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert [(r["sample_id"], r["system"]) for r in rows] == [(q.question_id, s) for q in qs
                                                             for s in ("nemori", "no-memory")]  # question order
    assert len(rows) == 4 * 2 and {r["category"] for r in rows} == {
        "temporal-reasoning", "single-session-preference", "knowledge-update"}
    # P_ans is asked at the question date; retrieval uses the bare question
    asked = [i["question"] for name, i in lm.prompts if name == "AnswerQuestion"]
    assert any("(Current date: 2023/05/30 (Tue) 23:40)" in a for a in asked)
    assert dated_question(qs[0]).startswith(qs[0].question)
    # per-type judges: the abstention one for the _abs question, the rubric judge for preference
    assert {"JudgeLongMemEvalTemporal", "JudgeLongMemEvalPreference", "JudgeLongMemEvalAbstention"} <= set(lm.calls)
    nemori = summary.scores["nemori"]
    assert nemori["judge.temporal-reasoning"] == 0.5  # "3 days" ✓ for gold "3", ✗ for "12 days"
    assert nemori["judge.abstention"] == 1.0 and nemori["n.abstention"] == 1 and nemori["n.overall"] == 4
    assert nemori["judge.single-session-preference"] == 1.0
    # upstream's metrics: task-averaged over the three types present
    assert summary.longmemeval["nemori"]["judge"]["task_averaged"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert nemori["judge.task-averaged"] == pytest.approx((0.5 + 1 + 1) / 3)
    # F1 only where the reference is an answer (not for the rubric or the abstention explanation)
    assert all(r["f1"] is None for r in rows if r["category"] == "single-session-preference" or r["is_abstention"])
    # evidence recall on LongMemEval's own turn ids ("<session>:<turn>"); none for the control
    assert all(r["recall_at_10"] == 1.0 for r in rows if r["system"] == "nemori" and r["evidence"])
    assert all(r["recall_at_1"] is None for r in rows if r["system"] == "no-memory")
    assert "temporal-reasoning" in summary.table and "abstention" in summary.table
    assert "multi-session" not in summary.table  # types the file lacks get no rows
    assert "f1_locomo" not in summary.table
    # the audit: both temporal questions lend each other their gold as the wrong answer
    audit = summary.judge_audit["judge"]
    assert (audit.n_gold, audit.n_wrong) == (2, 2) and audit.on_gold == 1.0
    saved = json.loads((tmp_path / "run/summary.json").read_text())
    assert saved["benchmark"] == "LongMemEval" and saved["judge_audit"] == summary.judge_audit_dicts()
    assert saved["judge"]["prompt_hash"] == LongMemEvalJudge().prompt_hash


def test_audit_pairs_skip_abstention_and_preference(tmp_path):
    qs = load_longmemeval(official_file(tmp_path))
    pairs = longmemeval_audit_pairs(qs, 20)
    assert [(p.sample_id, p.wrong) for p in pairs] == [("q-temporal", "12 days"), ("q-temporal-2", "3")]
    assert pairs[0].example.question_type == "temporal-reasoning"
    assert longmemeval_audit_pairs(qs, 1) == pairs[:1] and longmemeval_audit_pairs(qs, 0) == []
