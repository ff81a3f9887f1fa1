"""Usage ledger: per-stage accounting, cache hits apart from calls, per-call scopes across threads."""

from __future__ import annotations

import threading

import pytest

from nemori_dspy.usage import LEDGER, stage


def test_calls_tokens_and_cache_hits_per_stage():
    with stage("narrate"):
        LEDGER.record_response({"prompt_tokens": 100, "completion_tokens": 20}, 0.001)
        LEDGER.record_response({}, None)  # cache hit: no usage reported
    u = LEDGER.snapshot()["narrate"]
    assert (u.calls, u.cache_hits, u.input_tokens, u.output_tokens) == (1, 1, 100, 20)
    assert abs(u.cost_usd - 0.001) < 1e-12
    assert "narrate" in LEDGER.table() and "total" in LEDGER.table()


def test_scopes_only_see_their_own_thread():
    results = {}
    barrier = threading.Barrier(2)

    def work(name, n):
        with LEDGER.scope() as mine, stage("answer"):
            barrier.wait()
            for _ in range(n):
                LEDGER.record_response({"prompt_tokens": 10, "completion_tokens": 1}, 0)
        results[name] = mine.total().calls

    threads = [threading.Thread(target=work, args=("a", 3)), threading.Thread(target=work, args=("b", 5))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results == {"a": 3, "b": 5}
    assert LEDGER.snapshot()["answer"].calls == 8


def test_embedding_calls_are_counted_apart_from_llm_stages():
    from nemori_dspy.embedders import HashingEmbedder
    from nemori_dspy.usage import LEDGER

    LEDGER.reset()
    emb = HashingEmbedder(16)
    with LEDGER.scope() as mine:
        emb.embed(["a b", "c"])
        emb.embed(["d"])
    e = LEDGER.embedding_summary()
    assert (e["calls"], e["texts"]) == (2, 3) and e["seconds"] >= 0
    assert mine.embedding_summary()["texts"] == 3
    assert LEDGER.snapshot() == {}  # no LLM stage row appears for embeddings
    LEDGER.reset()
    assert LEDGER.embedding_summary()["calls"] == 0


def test_litellm_embedder_records_provider_tokens_and_cost(monkeypatch):
    import litellm

    from nemori_dspy.embedders import LiteLLMEmbedder
    from nemori_dspy.usage import LEDGER

    class Resp:
        def __init__(self, n):
            self.data = [{"index": i, "embedding": [1.0, 0.0]} for i in range(n)]
            self.usage = {"prompt_tokens": 5 * n}
            self._hidden_params = {"response_cost": 0.001}

    monkeypatch.setattr(litellm, "embedding", lambda input, **kw: Resp(len(input)))
    LEDGER.reset()
    LiteLLMEmbedder("openai/text-embedding-3-small", batch_size=2).embed(["a", "b", "c"])
    e = LEDGER.embedding_summary()
    assert (e["calls"], e["texts"], e["tokens"]) == (1, 3, 15) and e["cost_usd"] == pytest.approx(0.002)
