"""Each issue-10 benchmark runs end to end at toy size so it cannot rot: its table prints, its JSON (with the
machine) is written. No timing is asserted; the model-serving one runs only live (real llama.cpp server)."""

from __future__ import annotations

import json

import pytest

from benchmarks import framework_overhead, local_serving, parallel_construction, query_embedding
from nemori_dspy.embedders import find_minilm_dir, find_minilm_onnx_dir

_MINILM = find_minilm_dir(None)


def _result(tmp_path, name):
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["benchmark"] == name and data["machine"]["cores"] >= 1 and data["machine"]["cpu"]
    return data["figures"]


def test_framework_overhead_toy(tmp_path, capsys):
    f = framework_overhead.main(["--conversations", "1", "--messages", "12", "--out-dir", str(tmp_path)])
    assert f["messages"] == 12 and f["lm_calls"] > 0 and f["episodes"] >= 1
    assert "messages per second" in capsys.readouterr().out
    assert _result(tmp_path, "framework_overhead")["messages"] == 12


def test_framework_overhead_profile_names_the_pipeline(tmp_path):
    f = framework_overhead.run(1, 8, profile=True)
    assert "pipeline.py" in f["profile"]


def test_parallel_construction_toy(tmp_path, capsys):
    f = parallel_construction.main(["--conversations", "2", "--messages", "6", "--delay", "0.001",
                                    "--out-dir", str(tmp_path)])
    assert f["lm_calls"] == f["lm_calls_threads"] > 0 and f["speedup"] > 0
    assert "speed-up" in capsys.readouterr().out
    assert _result(tmp_path, "parallel_construction")["lm_calls"] == f["lm_calls"]


@pytest.mark.skipif(_MINILM is None or find_minilm_onnx_dir(_MINILM) is None,
                    reason="model download: local all-MiniLM-L6-v2 with its onnx/ folder (.ci/setup writes both)")
def test_query_embedding_toy(tmp_path, capsys):
    f = query_embedding.main(["--queries", "3", "--out-dir", str(tmp_path)])
    assert f["torch"]["queries"] == f["onnx"]["queries"] == 3 and f["min_cosine"] >= 0.999
    assert "p50" in capsys.readouterr().out
    assert _result(tmp_path, "query_embedding")["onnx"]["class"] == "OnnxMiniLMEmbedder"


def test_local_serving_prompts_are_the_pipeline_signatures():
    from nemori_dspy.adapters import make_adapter

    for stage in local_serving.STAGES:
        messages = local_serving.stage_messages(stage, 0, make_adapter("chat"))
        assert [m["role"] for m in messages] == ["system", "user"] and len(messages[1]["content"]) > 100


@pytest.mark.live
def test_local_serving_toy(tmp_path, capsys):
    f = local_serving.main(["--stages", "narrate,answer", "--max-tokens", "4", "--out-dir", str(tmp_path)])
    for stage in ("narrate", "answer"):
        assert f[stage]["no_reuse"]["prompt_tokens"] > 100 and f[stage]["prefix_reuse"]["completion_tokens"] >= 1
    assert "prefix reuse" in capsys.readouterr().out
    assert _result(tmp_path, "local_serving")["narrate"]
