"""Opt-in MLflow traces of the servers (``apps.serving.tracing``), read back from a sqlite MLflow store in ``tmp_path``:
REST requests and background passes (uvicorn in a thread, httpx), MCP tool calls (the SDK's in-process client), a
ScriptedLM behind them; off by default."""

from __future__ import annotations

from pathlib import Path

import anyio
import dspy
import httpx
import pytest

mlflow = pytest.importorskip("mlflow")

from mcp import Client  # noqa: E402

from nemori_dspy.apps.serving.http import create_app  # noqa: E402
from nemori_dspy.apps.serving.mcp import build_mcp_server  # noqa: E402
from nemori_dspy.apps.serving.tracing import ServeTracer, serve_tracer  # noqa: E402
from nemori_dspy.apps.serving.worker import BackgroundProcessor  # noqa: E402
from nemori_dspy.config import NemoriSettings  # noqa: E402
from nemori_dspy.embedders import HashingEmbedder  # noqa: E402
from nemori_dspy.memory import Memory  # noqa: E402
from nemori_dspy.store.sqlite import SQLiteStore  # noqa: E402
from tests.fakes import RunningServer, ScriptedLM, default_responders, messages, wait_until  # noqa: E402


@pytest.fixture
def memory(tmp_path: Path):
    store = SQLiteStore(tmp_path / "serve.db")
    yield Memory(store, HashingEmbedder(64), NemoriSettings(window_size=4))
    store.close()


def _settings(uri: str, on: bool = True) -> NemoriSettings:
    return NemoriSettings(mlflow_tracking_uri=uri, serve_tracing=on)


def _traces(tracer: ServeTracer) -> list:
    tracer.close()
    return mlflow.search_traces(locations=[tracer.experiment_id], return_type="list", max_results=200)


def _stages(trace) -> list[str]:
    return [s.attributes["nemori.stage"] for s in trace.data.spans if "nemori.stage" in s.attributes]


def test_rest_requests_and_background_passes_are_traced(memory, mlflow_db):
    lm = ScriptedLM(default_responders())
    with serve_tracer(_settings(mlflow_db)) as tracer:
        proc = BackgroundProcessor(memory, threads=1, lm=lm, adapter=dspy.ChatAdapter(), tracer=tracer)
        with RunningServer(create_app(memory, proc)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.post("/v1/users/ada/messages", json={"messages": messages(8)}).status_code == 202
            wait_until(lambda: not c.get("/v1/users/ada/status").json()["processing"], what="ada processed")
            assert c.post("/v1/users/ada/answer", json={"question": "Where is Lisbon?"}).status_code == 200
        traces = _traces(tracer)
    assert tracer.experiment == "nemori-dspy-serve"
    by_name: dict[str, list] = {}
    for t in traces:
        by_name.setdefault(t.info.tags["mlflow.traceName"], []).append(t)
        assert t.info.tags["user_id"] == "ada"
    working = [t for t in by_name["process"] if _stages(t)]  # the pass's last call finds no full window left
    assert len(working) == 2  # two windows of 4 messages, one trace each
    assert {"partition", "narrate"} <= {s for t in working for s in _stages(t)}
    (answer,) = by_name["answer"]
    assert _stages(answer) == ["answer"] and answer.info.tags["operation"] == "answer"
    span = next(s for s in answer.data.spans if s.attributes.get("nemori.stage") == "answer")
    assert span.attributes["nemori.input_tokens"] > 0 and span.outputs


def test_mcp_tool_calls_are_traced(memory, mlflow_db):
    lm = ScriptedLM(default_responders())

    async def session(server) -> None:
        async with Client(server) as c:
            await c.call_tool("remember", {"user_id": "bo", "messages": [
                {"speaker": "user", "content": "I moved to Lisbon in May."}]})
            await c.call_tool("answer_from_memory", {"user_id": "bo", "question": "Where do I live?"})
            await c.call_tool("search_memory", {"user_id": "bo", "query": "Lisbon"})

    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()), serve_tracer(_settings(mlflow_db)) as tracer:
        store_only = BackgroundProcessor(memory, threads=0)  # remember queues; no worker builds memory here
        anyio.run(session, build_mcp_server(memory, tracer=tracer, processor=store_only))
        traces = _traces(tracer)
    names = {t.info.tags["mlflow.traceName"]: t for t in traces}
    assert set(names) == {"mcp remember", "mcp answer", "mcp search"}
    assert all(t.info.tags["user_id"] == "bo" for t in traces)
    assert _stages(names["mcp remember"]) == []  # remember queues and returns: the worker's pass is its own trace
    assert _stages(names["mcp answer"]) == ["answer"] and _stages(names["mcp search"]) == []


def test_tracing_is_off_by_default(memory, mlflow_db):
    assert NemoriSettings().serve_tracing is False
    with serve_tracer(_settings(mlflow_db, on=False)) as tracer:
        assert tracer is None
        proc = BackgroundProcessor(memory, threads=0, tracer=tracer)
        with proc.traced("answer", user_id="ada") as span:
            assert span is None
    mlflow.set_tracking_uri(mlflow_db)
    assert mlflow.get_experiment_by_name("nemori-dspy-serve") is None
