"""Usage ledger: per-stage accounting, cache hits apart from calls, per-call scopes across threads."""

from __future__ import annotations

import threading

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
