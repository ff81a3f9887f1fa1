"""Usage ledgers: per-stage accounting, cache hits apart from calls, scoped (never process-wide) charging
that follows threads which copy their context."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest

from nemori_dspy.usage import UsageLedger, active_ledgers, charge_response, charging, stage, tally


def test_calls_tokens_and_cache_hits_per_stage(ledger):
    with stage("narrate"):
        charge_response({"prompt_tokens": 100, "completion_tokens": 20}, 0.001)
        charge_response({}, None)  # cache hit: no usage reported
    u = ledger.snapshot()["narrate"]
    assert (u.calls, u.cache_hits, u.input_tokens, u.output_tokens) == (1, 1, 100, 20)
    assert abs(u.cost_usd - 0.001) < 1e-12
    assert "narrate" in ledger.table() and "total" in ledger.table()


def test_scopes_only_see_their_own_thread(ledger):
    results = {}
    barrier = threading.Barrier(2)

    def work(name, n):
        with ledger.scope() as mine, stage("answer"):
            barrier.wait()
            for _ in range(n):
                charge_response({"prompt_tokens": 10, "completion_tokens": 1}, 0)
        results[name] = mine.total().calls

    threads = [threading.Thread(target=work, args=("a", 3)), threading.Thread(target=work, args=("b", 5))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results == {"a": 3, "b": 5}
    assert ledger.snapshot()["answer"].calls == 8


def test_a_charge_outside_a_ledger_reaches_no_ledger():
    a = UsageLedger()
    with a.charging():
        tally("x")
    tally("x")  # a is no longer active
    charge_response({"prompt_tokens": 1, "completion_tokens": 1}, 0)
    assert a.counters == {"x": 1} and a.snapshot() == {}


def test_counters_honour_scopes(ledger):
    tally("retries")
    with ledger.scope() as mine:
        tally("retries", 2)
        tally("parked_windows")
    assert mine.counters == {"retries": 2, "parked_windows": 1}
    assert ledger.counters == {"retries": 3, "parked_windows": 1}


def test_nested_ledgers_are_all_charged_and_one_active_twice_counts_once():
    outer, inner = UsageLedger(), UsageLedger()
    with outer.charging(), charging(inner, outer, inner):
        assert active_ledgers()[-2:] == (outer, inner) and active_ledgers().count(outer) == 1
        tally("n")
    assert outer.counters == {"n": 1} and inner.counters == {"n": 1}


def test_merged_is_the_sum_of_its_ledgers():
    a, b = UsageLedger(), UsageLedger()
    with a.charging(), stage("answer"):
        charge_response({"prompt_tokens": 5, "completion_tokens": 1}, 0.5)
        tally("retries")
    with b.charging(), stage("answer"):
        charge_response({"prompt_tokens": 7, "completion_tokens": 2}, 0.25)
    total = UsageLedger.merged([a, b])
    u = total.snapshot()["answer"]
    assert (u.calls, u.input_tokens, u.output_tokens, u.cost_usd) == (2, 12, 3, 0.75)
    assert total.counters == {"retries": 1}


def test_threads_that_copy_their_context_keep_their_ledger():
    mine, other = UsageLedger(), UsageLedger()

    def work(n):
        for _ in range(n):
            tally("work")

    with mine.charging():
        with ThreadPoolExecutor(max_workers=2) as pool:
            for f in [pool.submit(contextvars.copy_context().run, work, n) for n in (2, 3)]:
                f.result()
        asyncio.run(asyncio.to_thread(work, 4))
    with other.charging():
        work(1)
    assert mine.counters == {"work": 9} and other.counters == {"work": 1}


def test_dspy_parallel_worker_threads_keep_the_ledger():
    """DSPy's ParallelExecutor (dspy.Evaluate / optimizers with num_threads > 1) copies dspy's overrides only."""
    from dspy.utils.parallelizer import ParallelExecutor

    mine = UsageLedger()
    with mine.charging():
        ParallelExecutor(num_threads=3, disable_progress_bar=True).execute(lambda x: tally("item"), list(range(6)))
    assert mine.counters == {"item": 6}


def test_dspy_context_inside_a_ledger_keeps_it(ledger):
    with dspy.context(adapter=dspy.JSONAdapter()):
        tally("inside")
    assert ledger.counters == {"inside": 1}


def test_embedding_calls_are_counted_apart_from_llm_stages(ledger):
    from nemori_dspy.embedders import HashingEmbedder

    emb = HashingEmbedder(16)
    with ledger.scope() as mine:
        emb.embed(["a b", "c"])
        emb.embed(["d"])
    e = ledger.embedding_summary()
    assert (e["calls"], e["texts"]) == (2, 3) and e["seconds"] >= 0
    assert mine.embedding_summary()["texts"] == 3
    assert ledger.snapshot() == {}  # no LLM stage row appears for embeddings
    ledger.reset()
    assert ledger.embedding_summary()["calls"] == 0


def test_litellm_embedder_records_provider_tokens_and_cost(monkeypatch, ledger):
    import litellm

    from nemori_dspy.embedders import LiteLLMEmbedder

    class Resp:
        def __init__(self, n):
            self.data = [{"index": i, "embedding": [1.0, 0.0]} for i in range(n)]
            self.usage = {"prompt_tokens": 5 * n}
            self._hidden_params = {"response_cost": 0.001}

    monkeypatch.setattr(litellm, "embedding", lambda input, **kw: Resp(len(input)))
    LiteLLMEmbedder("openai/text-embedding-3-small", batch_size=2).embed(["a", "b", "c"])
    e = ledger.embedding_summary()
    assert (e["calls"], e["texts"], e["tokens"]) == (1, 3, 15) and e["cost_usd"] == pytest.approx(0.002)
