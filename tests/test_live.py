"""One short live smoke through the real llama.cpp server and the 0.5B model (opt in: --live).

Checks invariants, not answer quality: messages ingested into exactly one episode each, a question
answered, usage recorded per stage, the server stopped afterwards; plus issue 4's date case (a
relative date in a message becomes an absolute one in the narrative). One server serves the module.
"""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.runtime import build_runtime
from nemori_dspy.store.sqlite import SQLiteStore

pytestmark = pytest.mark.live

TURNS = [  # written for this project (no LoCoMo text)
    ("Caroline", "I went to a pottery workshop yesterday and it was so relaxing.", "2023-05-08T13:56:00"),
    ("Melanie", "That's great, Caroline! What did you make there?", "2023-05-08T13:57:00"),
    ("Caroline", "A blue bowl for my kitchen. The teacher was very patient.", "2023-05-08T13:58:00"),
    ("Melanie", "I painted a sunrise over the lake last week, it calms me.", "2023-05-08T13:59:00"),
]


# the short smoke runs every stage on the 0.5B model (local_memory_model=None: no second, 1.5B server)
SETTINGS = dict(model="local", local_model_size="0.5b", local_memory_model=None, window_size=20, max_tokens=256,
                cache=False)


@pytest.fixture(scope="module")
def live():
    rt = build_runtime(NemoriSettings(**SETTINGS, _env_file=None), configure=False)
    yield rt
    rt.close()
    assert rt.server is None


def test_live_ingest_and_answer(tmp_path, live, ledger):
    settings = live.settings
    with dspy.context(lm=live.lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        mem.add_messages("caroline", [{"speaker": s, "content": c, "timestamp": t, "id": f"D1:{i}"}
                                      for i, (s, c, t) in enumerate(TURNS, 1)])
        report = mem.flush("caroline")
        res = mem.answer("caroline", "What workshop did Caroline attend?")
    ids = [m for ep in mem.list_episodes("caroline") for m in ep.message_ids]
    assert sorted(ids) == ["D1:1", "D1:2", "D1:3", "D1:4"], report
    assert isinstance(res.answer, str) and res.answer
    usage = ledger.snapshot()
    assert usage["narrate"].calls >= 1 and usage["narrate"].input_tokens > 0
    assert usage["answer"].calls == 1 and res.usage.output_tokens > 0


def test_live_relative_date_becomes_absolute_in_the_narrative(tmp_path, live):
    """Issue 4 case 2: "went to Paris last week", said on 2023-05-24 → the narrative places it in May 2023."""
    with dspy.context(lm=live.lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), live.settings)
        mem.add_messages("jon", [
            {"speaker": "Jon", "content": "I went to Paris last week, the Louvre was amazing!",
             "timestamp": "2023-05-24T10:00:00", "id": "p1"},
            {"speaker": "Gina", "content": "Wow, Paris! What was your favourite painting?",
             "timestamp": "2023-05-24T10:01:00", "id": "p2"}])
        mem.flush("jon")
    episodes = mem.list_episodes("jon")
    assert sorted(m for ep in episodes for m in ep.message_ids) == ["p1", "p2"]
    text = " ".join(ep.narrative for ep in episodes)
    assert "2023" in text and ("May" in text or "2023-05" in text), text


def test_live_http_server_adds_in_the_background_and_answers(tmp_path, live):
    """The REST surface on the real model: messages accepted at once (202), built by the background worker,
    answered through the same Memory; nothing lost."""
    import httpx

    from nemori_dspy.apps.serving.http import create_app
    from nemori_dspy.apps.serving.worker import BackgroundProcessor
    from tests.fakes import RunningServer, wait_until

    store = SQLiteStore(tmp_path / "serve.db")
    mem = Memory(store, HashingEmbedder(64), live.settings)
    proc = BackgroundProcessor(mem, threads=1, lm=live.lm, adapter=dspy.ChatAdapter())
    with RunningServer(create_app(mem, proc, token="t0k")) as srv, \
            httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer t0k"}, timeout=600) as c:
        body = {"messages": [{"speaker": s, "content": t, "timestamp": ts, "id": f"H{i}"}
                             for i, (s, t, ts) in enumerate(TURNS, 1)]}
        assert c.post("/v1/users/caroline/messages", json=body).status_code == 202
        assert c.post("/v1/users/caroline/flush", params={"wait": "true"}).status_code == 202
        wait_until(lambda: not c.get("/v1/users/caroline/status").json()["processing"], timeout=600,
                   what="the background worker")
        ans = c.post("/v1/users/caroline/answer", json={"question": "What did Caroline make?"}).json()
    store.close()
    assert isinstance(ans["answer"], str) and ans["answer"]
    assert sorted(m for ep in mem.list_episodes("caroline") for m in ep.message_ids) == ["H1", "H2", "H3", "H4"]


NOISE_TURNS = [  # written for this project: two human lines, three kinds of machine noise
    ("Dana", "I start my new job as a nurse in Leeds next Monday.", "2023-06-01T09:00:00"),
    ("bot", 'Traceback (most recent call last):\n  File "sync.py", line 12, in run\n    push(batch)\n'
            "KeyError: 'user_17'", "2023-06-01T09:01:00"),
    ("bot", "[heartbeat] ok seq=4412", "2023-06-01T09:02:00"),
    ("bot", "Jun  1 09:03:01 host CRON[2211]: (root) CMD (/usr/bin/backup.sh)", "2023-06-01T09:03:00"),
    ("Eli", "Congratulations Dana! Leeds General is a great hospital.", "2023-06-01T09:04:00"),
]
NOISE_WORDS = ("traceback", "keyerror", "sync.py", "heartbeat", "seq=", "cron", "backup.sh", "user_17")


def test_live_machine_noise_does_not_become_facts(tmp_path, live, capsys):
    """Issue 12: a traceback, a heartbeat and a cron line in a conversation; with the real 0.5B model no
    semantic entry may speak of them (the noise guard), the human fact may be learnt; the raw messages stay."""
    with dspy.context(lm=live.lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), live.settings)
        mem.add_messages("dana", [{"speaker": s, "content": c, "timestamp": t, "id": f"n{i}"}
                                  for i, (s, c, t) in enumerate(NOISE_TURNS, 1)])
        mem.flush("dana")
    facts = [e.text for e in mem.list_semantic("dana")]
    noisy = [f for f in facts if any(w in f.lower() for w in NOISE_WORDS)]
    with capsys.disabled():
        print(f"\nlive noise: {len(NOISE_TURNS) - 2} noise messages, {len(facts)} facts, {len(noisy)} about noise: {noisy}")
    assert noisy == [], facts
    assert sorted(m for ep in mem.list_episodes("dana") for m in ep.message_ids) == [f"n{i}" for i in range(1, 6)]


def test_live_hosted_path_answers_and_judges_in_threads(tmp_path, live, monkeypatch, mlflow_db, capsys):
    """Issue 22: the hosted path — this machine's llama.cpp server addressed as an OpenAI-compatible endpoint
    (``openai/local`` + ``api_base``, retries and timeouts as for a provider) — through ``eval locomo`` with answers
    and verdicts in 4 threads and the live MLflow record: every question once, in question order, real tokens."""
    import json

    import mlflow

    from nemori_dspy.apps.cli import main
    from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions, stratified_questions
    from tests.fakes import SYNTHETIC_MINI

    monkeypatch.setenv("NEMORI_API_KEY", "sk-live-hosted")  # the OpenAI client needs one; the server ignores it
    monkeypatch.setenv("NEMORI_CACHE_DIR", str(tmp_path / "cache"))
    args = ["eval", "locomo", "--data", str(SYNTHETIC_MINI), "--sessions", "1-1", "--max-questions", "3",
            "--system", "nemori", "--model", "openai/local", "--api-base", live.server.api_base,
            "--embedder", "hashing-64", "--window-size", "20", "--judge-audit", "0", "--concurrency", "4",
            "--db", str(tmp_path / "m.db"), "--out", str(tmp_path / "run"), "--mlflow-tracking-uri", mlflow_db]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cost estimate: unpriced (openai/local" in out and "in 4 threads" in out
    conv = slice_sessions(load_locomo(SYNTHETIC_MINI)[0], parse_sessions("1-1"))
    asked = [q.index for q in stratified_questions([q for q in conv.questions if q.category <= 4], 3)]
    rows = [json.loads(x) for x in (tmp_path / "run/results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == asked and all(isinstance(r["answer"], str) for r in rows)
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    usage = summary["usage"]
    assert usage["answer"]["calls"] >= len(asked) and usage["answer"]["input_tokens"] > 0
    ruled = sum(n for name, n in summary["counters"].items() if name.startswith("judge_known_wrong."))  # no call
    assert usage["judge"]["calls"] + ruled >= len(asked) and summary["construction_usage"]["narrate"]["calls"] >= 1
    assert summary["concurrency"] == 4 and summary["judges"]["judge"]["model"] == "openai/local"
    mlflow.set_tracking_uri(mlflow_db)
    run_id = json.loads((tmp_path / "run/mlflow_run.json").read_text())["parent"]
    assert mlflow.get_run(run_id).info.status == "FINISHED"
    with capsys.disabled():
        print(f"\nlive hosted path: {len(rows)} questions, answers {[r['answer'][:40] for r in rows]}, judge "
              f"{[r.get('judge') for r in rows]}, answering and judging {summary['answer_seconds']} s in 4 threads")
