"""The LoCoMo main job end to end with a scripted LM (no network, no model), on tests/data/synthetic_mini.json:
one LoCoMo-schema conversation (synth-1: sessions of 19, 17 and 20 turns on 3 April, 21 April and 12 May 2023;
20 scored questions in categories 1-4, 5 of category 5; 5 image turns)."""

from __future__ import annotations

import json

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.judge import LLMJudge
from nemori_dspy.eval.runner import EvalOptions, run_locomo
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import SYNTHETIC_MINI, ScriptedLM, default_responders


def test_mini_run_covers_every_turn_and_writes_results(tmp_path, synthetic_mini):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        summary = run_locomo(mem, synthetic_mini, EvalOptions(progress=False), LLMJudge(), tmp_path / "run")
    cov = summary.coverage["synth-1"]
    assert (cov.messages, cov.in_one_episode, cov.in_no_episode, cov.in_several) == (56, 56, 0, 0)
    rows = [json.loads(line) for line in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 20 and {r["system"] for r in rows} == {"nemori", "no-memory"}
    assert {r["category"] for r in rows} == {1, 2, 3, 4}
    # context size is measured on the context itself: none without memory, some with it
    assert {r["context_tokens"] for r in rows if r["system"] == "no-memory"} == {0}
    assert all(r["context_tokens"] > 0 for r in rows if r["system"] == "nemori")
    assert summary.scores["nemori"]["n.overall"] == 20
    # the scripted answerer says "7 May 2023" with memory and "I don't know" without; the scripted judge
    # says CORRECT when the answer is inside the gold one: only for "When did Elias finish the Lakeside …?"
    scores = summary.scores
    assert scores["nemori"]["f1.overall"] > scores["no-memory"]["f1.overall"]
    assert (scores["nemori"]["judge.temporal"], scores["nemori"]["judge.overall"]) == (1 / 7, 1 / 20)
    assert scores["no-memory"]["judge.overall"] == 0.0
    assert [scores["nemori"][f"n.{c}"] for c in ("multi-hop", "temporal", "open-domain", "single-hop")] == [4, 7, 2, 7]
    usage = summary.construction_usage
    # a window of w = 40 ends at its last time gap (hold_open_segment): the first 40 turns (D1:1-19, D2:1-17,
    # D3:1-4) form D1 and D2, cut apart at the gap before P_par, and D3:1-4 stay buffered; D3 (20 turns) forms
    # at the flush: one P_par call per session. Groups of 5 give 4 | 4 | 4 episodes, each narrated once (the
    # scripted P_sel never continues one)
    assert usage["partition"]["calls"] == 3 and usage["narrate"]["calls"] == 12
    assert "n=" in summary.table and (tmp_path / "run/tables.md").exists()
    # model="local": dollars read "local" in the usage table too, not 0.0000
    usage_total = next(l for l in summary.usage_table.splitlines() if l.startswith("total"))
    assert usage_total.endswith("local") and "0.0000" not in (tmp_path / "run/tables.md").read_text()
    assert summary.judge.prompt_hash and summary.parked == []


def test_image_turns_reach_memory_with_their_caption(tmp_path, synthetic_mini):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        run_locomo(mem, synthetic_mini, EvalOptions(progress=False, max_questions=1, systems=[SYSTEMS["nemori"]]), None, tmp_path / "r")
    narrated = "\n".join(inp["messages"] for name, inp in lm.prompts if name == "NarrateEpisode")
    assert "[shares an image: a photo of a wooden workbench" in narrated and "2023-04-03" in narrated


def test_mlflow_run_holds_config_cost_and_scores(tmp_path, synthetic_mini, mlflow_db):
    pytest.importorskip("mlflow")
    import mlflow

    from nemori_dspy.eval.tracking import log_eval_run

    lm = ScriptedLM(default_responders())
    settings = NemoriSettings(mlflow_tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        summary = run_locomo(mem, synthetic_mini, EvalOptions(progress=False, max_questions=2), LLMJudge(), tmp_path / "run")
    run_id = log_eval_run(settings, summary, tmp_path / "run", {"dataset.path": str(SYNTHETIC_MINI)})
    run = mlflow.get_run(run_id)
    assert run.data.params["config.window_size"] == "40"
    assert run.data.params["config.evoke_threshold"] == "0.4"  # resolved: MiniLM's measured τ
    assert "prompt.partition" in run.data.params and "judge.prompt_hash" in run.data.params
    assert run.data.metrics["cost.narrate.calls"] >= 3
    assert "nemori.judge.overall" in run.data.metrics and "no-memory.f1.overall" in run.data.metrics
    assert "api_key" not in json.dumps(run.data.params).replace("api_key_set", "")


def test_concurrent_construction_builds_every_conversation_in_its_own_user(tmp_path, synthetic_mini):
    """--concurrency 2: two conversations built in parallel threads, each complete and kept apart."""
    twin = synthetic_mini[0].model_copy(update={"sample_id": "synth-1-twin", "questions": [
        q.model_copy(update={"sample_id": "synth-1-twin"}) for q in synthetic_mini[0].questions]})
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        opts = EvalOptions(progress=False, max_questions=2, systems=[SYSTEMS["nemori"]], concurrency=2)
        summary = run_locomo(mem, [synthetic_mini[0], twin], opts, None, tmp_path / "run")
    for sid in ("synth-1", "synth-1-twin"):
        cov = summary.coverage[sid]
        assert (cov.messages, cov.in_one_episode, cov.in_several) == (56, 56, 0)
        assert {m for ep in mem.list_episodes(sid) for m in ep.message_ids} == {m.id for m in synthetic_mini[0].messages}
    rows = [json.loads(line) for line in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert sorted(r["sample_id"] for r in rows) == ["synth-1", "synth-1", "synth-1-twin", "synth-1-twin"]


def test_a_run_reports_its_own_usage_and_leaves_other_ledgers_intact(tmp_path, synthetic_mini, ledger):
    """No global reset: a run has its own ledger; an outer ledger (here the test's) and the memory keep theirs."""
    from nemori_dspy.usage import tally

    tally("before_the_run")
    opts = EvalOptions(progress=False, max_questions=2, systems=[SYSTEMS["nemori"]])
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        first = run_locomo(mem, synthetic_mini, opts, LLMJudge(), tmp_path / "a")
        calls_after_first = sum(lm.calls.values())
        second = run_locomo(mem, synthetic_mini, opts, LLMJudge(), tmp_path / "b")  # memory reused: answers only
    assert ledger.counters["before_the_run"] == 1  # not reset by either run
    run_calls = lambda s: sum(u["calls"] + u["cache_hits"] for u in s.usage.values())  # noqa: E731
    assert run_calls(first) == calls_after_first and run_calls(second) == sum(lm.calls.values()) - calls_after_first
    assert "partition" not in second.usage and second.usage["answer"]["calls"] == 2
    # the memory was charged with its construction and both runs' answers, not the judge's calls
    assert mem.usage.snapshot()["answer"].calls == 4 and "judge" not in mem.usage.snapshot()
    cost = json.loads((tmp_path / "b/cost.json").read_text())
    assert set(cost) == {"usage", "construction_usage", "counters", "embedding_usage", "ingest_seconds"}
    assert cost["usage"] == second.usage
