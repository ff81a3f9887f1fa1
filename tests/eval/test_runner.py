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


# --- answers and judgements in threads (--concurrency): same rows, question order, exact resume, rate limits

def _uneven(responders, delays=(0.03, 0.0, 0.015)):
    """``responders`` with the answer and the judges sleeping 0-30 ms depending on the question, so answers
    finish out of question order when threads run them."""
    import time

    from nemori_dspy.testing import prompt_hash

    def slow(fn):
        def inner(inputs):
            time.sleep(delays[prompt_hash({"q": inputs.get("question", "")}) % len(delays)])
            return fn(inputs)
        return inner

    return {k: slow(v) if k in ("AnswerQuestion", "JudgeAnswer") else v for k, v in responders.items()}


def _locomo(tmp_path, conversations, out, lm, concurrency, **opts):
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(num_retries=2))
        options = EvalOptions(progress=False, concurrency=concurrency,
                              systems=[SYSTEMS["nemori"], SYSTEMS["no-memory"]], **opts)
        return run_locomo(mem, conversations, options, LLMJudge(), tmp_path / out)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


_TIMING = ("search_ms", "total_ms")


def test_threaded_answers_give_the_sequential_rows_in_question_order(tmp_path, synthetic_mini):
    seq = _locomo(tmp_path, synthetic_mini, "seq", ScriptedLM(_uneven(default_responders())), 1)
    par = _locomo(tmp_path, synthetic_mini, "par", ScriptedLM(_uneven(default_responders())), 6)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in _TIMING} for r in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "par/results.jsonl")) == strip(_rows(tmp_path / "seq/results.jsonl"))
    assert strip(par.rows) == strip(seq.rows) and len(par.rows) == 40
    assert par.scores == seq.scores and par.paired == seq.paired  # the bootstrap sees the rows in the same order
    assert (par.concurrency, seq.concurrency) == (6, 1) and par.answer_seconds > 0
    summary = json.loads((tmp_path / "par/summary.json").read_text())
    assert summary["concurrency"] == 6 and summary["questions"] == 20


def test_answers_are_asked_system_by_system_with_shared_context_prefixes_adjacent(tmp_path, synthetic_mini):
    responders = default_responders()
    asked = []
    answer = responders["AnswerQuestion"]

    def recording(inputs):
        asked.append((inputs["context"], inputs["question"]))
        return answer(inputs)

    responders["AnswerQuestion"] = recording
    run = _locomo(tmp_path, synthetic_mini, "run", ScriptedLM(responders), 1)
    with_memory = [a for a in asked if a[0]]
    # every nemori prompt, then every no-memory one: no empty-context call between two nemori ones
    assert len(with_memory) == 20 and asked[:20] == with_memory
    # nemori prompts in the order of their contexts, so those with the same top episodes are asked one after another
    assert [c for c, _ in with_memory] == sorted(c for c, _ in with_memory)
    assert len({c.split("\n")[1] for c, _ in with_memory}) < 20  # some share their first episode
    # the rows stay in question order, as results.jsonl always had them
    keys = [(r["index"], r["system"]) for r in run.rows]
    assert keys == sorted(keys, key=lambda k: (k[0], k[1] != "nemori"))


def test_an_interrupted_threaded_run_resumes_without_asking_a_question_twice(tmp_path, synthetic_mini):
    responders = _uneven(default_responders())
    calls = {"n": 0}
    answer = responders["AnswerQuestion"]

    def interrupted(inputs):  # the 9th answer call is where the user presses Ctrl-C
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return answer(inputs)

    responders["AnswerQuestion"] = interrupted
    with pytest.raises(KeyboardInterrupt):
        _locomo(tmp_path, synthetic_mini, "run", ScriptedLM(responders), 4)
    kept = _rows(tmp_path / "run/results.jsonl")
    assert 4 <= len(kept) < 40  # the answers in flight when it stopped were finished and kept
    with (tmp_path / "run/results.jsonl").open("a") as f:
        f.write('{"sample_id": "synth-1", "ind')  # and the kill tore the last line
    lm = ScriptedLM(default_responders())
    resumed = _locomo(tmp_path, synthetic_mini, "run", lm, 4, resume=True)
    rows = _rows(tmp_path / "run/results.jsonl")
    keys = [(r["system"], r["sample_id"], r["index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 40 and resumed.resumed_answers == len(kept)
    assert lm.calls["AnswerQuestion"] == 40 - len(kept)  # only the questions not yet answered were asked
    seq = _locomo(tmp_path, synthetic_mini, "seq", ScriptedLM(default_responders()), 1)
    assert keys == [(r["system"], r["sample_id"], r["index"]) for r in seq.rows]  # question order, as sequential


def _refused_for(question_part: str, times: int, responders, name="AnswerQuestion"):
    """``responders`` whose ``name`` reply to questions containing ``question_part`` is refused for rate limits
    the first ``times`` calls (as DSPy's engine raises it)."""
    from dspy import lm15

    left = {"n": times}
    inner = responders[name]

    def refusing(inputs):
        if question_part in inputs.get("question", "") and left["n"] > 0:
            left["n"] -= 1
            raise lm15.RateLimitError("429 too many requests", retry_after=0.0)
        return inner(inputs)

    return {**responders, name: refusing}


@pytest.fixture
def quick_backoff(monkeypatch):
    import nemori_dspy.eval.runner as runner

    monkeypatch.setattr(runner, "RATE_LIMIT_WAIT_S", 0.01)


@pytest.mark.parametrize("stage", ["AnswerQuestion", "JudgeAnswer"])
def test_a_rate_limited_question_is_asked_again_after_a_pause_not_scored_wrong(tmp_path, synthetic_mini,
                                                                             quick_backoff, stage):
    # "When did Elias finish the Lakeside …" is the one question the scripted judge finds CORRECT (nemori)
    refused = _refused_for("When did Elias finish", 2, default_responders(), stage)  # 2 = both attempts of a call
    summary = _locomo(tmp_path, synthetic_mini, "run", ScriptedLM(refused), 4)
    row = next(r for r in summary.rows if r["system"] == "nemori" and "When did Elias finish" in r["question"])
    assert row["answer"] == "7 May 2023" and row["judge"] == 1.0 and "answer_error" not in row
    assert summary.counters["answer_rate_limit_pauses"] == 1 and "answers_rate_limited" not in summary.counters
    assert summary.scores["nemori"]["judge.overall"] == 1 / 20 and summary.judge.failures == 0


def test_a_question_still_refused_is_left_unanswered_for_resume(tmp_path, synthetic_mini, quick_backoff, capsys):
    from nemori_dspy.apps.cli.evaluate import print_summary

    refused = _refused_for("When did Elias finish", 100, default_responders())  # both systems' answers refused
    summary = _locomo(tmp_path, synthetic_mini, "run", ScriptedLM(refused), 4)
    assert not [r for r in summary.rows if "When did Elias finish" in r["question"]]  # not scored at all
    assert len(summary.rows) == 38 and summary.counters["answers_rate_limited"] == 2
    assert summary.counters["answer_rate_limit_pauses"] == 2 * 2  # num_retries=2 pauses per question
    print_summary(summary, 1.0)
    assert "RATE LIMITED 2 answers" in capsys.readouterr().out
    resumed = _locomo(tmp_path, synthetic_mini, "run", ScriptedLM(default_responders()), 4, resume=True)
    assert len(resumed.rows) == 40 and resumed.scores["nemori"]["judge.overall"] == 1 / 20
