"""The LoCoMo main job end to end on locomo_mini.json with a scripted LM (no network, no model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.judge import LLMJudge
from nemori_dspy.eval.locomo import load_locomo
from nemori_dspy.eval.runner import EvalOptions, run_locomo
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, default_responders

MINI = Path(os.environ.get("NEMORI_LOCOMO_DIR", Path(__file__).resolve().parents[3] / "shared/data/locomo")) / "locomo_mini.json"


@pytest.fixture
def mini():
    if not MINI.exists():
        pytest.skip(f"{MINI} not found (set NEMORI_LOCOMO_DIR)")
    return load_locomo(MINI)


def test_mini_run_covers_every_turn_and_writes_results(tmp_path, mini):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        summary = run_locomo(mem, mini, EvalOptions(progress=False), LLMJudge(), tmp_path / "run")
    cov = summary["coverage"]["conv-26"]
    assert cov == {**cov, "messages": 58, "in_one_episode": 58, "in_no_episode": 0, "in_several": 0}
    rows = [json.loads(line) for line in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 20 and {r["system"] for r in rows} == {"nemori", "no-memory"}
    assert {r["category"] for r in rows} == {1, 2, 3, 4}
    # context size is measured on the context itself: none without memory, some with it
    assert {r["context_tokens"] for r in rows if r["system"] == "no-memory"} == {0}
    assert all(r["context_tokens"] > 0 for r in rows if r["system"] == "nemori")
    assert summary["scores"]["nemori"]["n.overall"] == 20
    # the scripted answerer says "7 May 2023" with memory and "I don't know" without
    assert summary["scores"]["nemori"]["f1.overall"] > summary["scores"]["no-memory"]["f1.overall"]
    usage = summary["construction_usage"]
    # 3 windows of ≤ 20 turns; windows 1 and 2 straddle a session boundary (17 and 15 days apart), so they
    # are cut at the time gap before P_par: 2 + 2 + 1 partition calls
    assert usage["partition"]["calls"] == 5 and usage["narrate"]["calls"] >= 5
    assert "n=" in summary["table"] and (tmp_path / "run/tables.md").exists()
    # model="local": dollars read "local" in the usage table too, not 0.0000
    usage_total = next(l for l in summary["usage_table"].splitlines() if l.startswith("total"))
    assert usage_total.endswith("local") and "0.0000" not in (tmp_path / "run/tables.md").read_text()
    assert summary["judge"]["prompt_hash"] and summary["parked"] == []


def test_image_turns_reach_memory_with_their_caption(tmp_path, mini):
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        run_locomo(mem, mini, EvalOptions(progress=False, max_questions=1, systems=[SYSTEMS["nemori"]]), None, tmp_path / "r")
    narrated = "\n".join(inp["messages"] for name, inp in lm.prompts if name == "NarrateEpisode")
    assert "[shares an image:" in narrated and "2023-05-08" in narrated


def test_mlflow_run_holds_config_cost_and_scores(tmp_path, mini):
    pytest.importorskip("mlflow")
    import mlflow

    from nemori_dspy.eval.tracking import log_eval_run

    lm = ScriptedLM(default_responders())
    settings = NemoriSettings(mlflow_tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        summary = run_locomo(mem, mini, EvalOptions(progress=False, max_questions=2), LLMJudge(), tmp_path / "run")
    run_id = log_eval_run(settings, summary, tmp_path / "run", {"dataset.path": str(MINI)})
    run = mlflow.get_run(run_id)
    assert run.data.params["config.window_size"] == "20"
    assert run.data.params["config.evoke_threshold"] == "0.7"
    assert "prompt.partition" in run.data.params and "judge.prompt_hash" in run.data.params
    assert run.data.metrics["cost.narrate.calls"] >= 3
    assert "nemori.judge.overall" in run.data.metrics and "no-memory.f1.overall" in run.data.metrics
    assert "api_key" not in json.dumps(run.data.params).replace("api_key_set", "")


def test_concurrent_construction_builds_every_conversation_in_its_own_user(tmp_path, mini):
    """--concurrency 2: two conversations built in parallel threads, each complete and kept apart."""
    twin = mini[0].model_copy(update={"sample_id": "conv-26-twin", "questions": [
        q.model_copy(update={"sample_id": "conv-26-twin"}) for q in mini[0].questions]})
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings())
        opts = EvalOptions(progress=False, max_questions=2, systems=[SYSTEMS["nemori"]], concurrency=2)
        summary = run_locomo(mem, [mini[0], twin], opts, None, tmp_path / "run")
    for sid in ("conv-26", "conv-26-twin"):
        cov = summary["coverage"][sid]
        assert (cov["messages"], cov["in_one_episode"], cov["in_several"]) == (58, 58, 0)
        assert {m for ep in mem.list_episodes(sid) for m in ep.message_ids} == {m.id for m in mini[0].messages}
    rows = [json.loads(line) for line in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert sorted(r["sample_id"] for r in rows) == ["conv-26", "conv-26", "conv-26-twin", "conv-26-twin"]
