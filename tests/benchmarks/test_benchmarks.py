"""Each issue-10 benchmark runs end to end at toy size so it cannot rot: its table prints, its JSON (with the
machine) is written. No timing is asserted; the model-serving one runs only live (real llama.cpp server)."""

from __future__ import annotations

import json

import pytest

from benchmarks import answer_throughput, framework_overhead, gguf_encoding, local_serving, parallel_construction, query_embedding
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


def test_answer_throughput_toy(tmp_path, capsys):
    f = answer_throughput.main(["--threads", "3", "--delay", "0.001", "--sequential-questions", "4",
                                "--scale", "2", "1", "6", "--out-dir", str(tmp_path)])
    assert (f["conversations"], f["turns"]) == (2, 112)
    assert f["threaded"]["questions"] == 12 and f["threaded"]["lm_calls"] == 24  # an answer and a verdict each
    assert f["sequential"]["questions"] == 4 and f["sequential_sampled"] and f["same_rows"] and f["speedup"] > 0
    assert "ratio (sequential / threaded" in capsys.readouterr().out
    assert _result(tmp_path, "answer_throughput")["threaded"]["questions"] == 12


def test_scaled_synthetic_keeps_evidence_in_its_repeat(tmp_path):
    from nemori_dspy.eval.locomo import load_locomo

    convs = load_locomo(answer_throughput.scaled_synthetic(tmp_path / "s.json", 2, 3, 45))
    assert [c.sample_id for c in convs] == ["synth-01", "synth-02"] and len(convs[0].messages) == 3 * 56
    ids = {m.id for m in convs[0].messages}
    assert len(convs[0].questions) == 45 and all(set(q.evidence) <= ids for q in convs[0].questions)
    assert convs[0].questions[44].evidence[0].startswith("D7:")  # question 45 is a third-repeat copy
    assert convs[0].messages[56].timestamp.date().isoformat() > convs[0].messages[55].timestamp.date().isoformat()


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


def test_gguf_encoding_rows_give_the_speed_ratio_and_same_replies():
    def calls(seconds, texts):
        return [{"seconds": s, "prompt_tokens": 2000, "completion_tokens": 10, "text": t} for s, t in zip(seconds, texts)]

    f = {"0.5b": {"q4_k_m": {"stages": {"answer": calls([16.0, 14.0], ["a", "b"])}},
                  "f16": {"stages": {"answer": calls([12.0, 10.0], ["a", "c"])}}}}
    assert gguf_encoding._rows(f, ["answer"]) == [["0.5b", "answer", "2000", "10", "15.00", "11.00", "1.36", "1/2"]]


@pytest.mark.live
def test_gguf_encoding_toy(tmp_path, capsys):
    f = gguf_encoding.main(["--sizes", "0.5b", "--stages", "answer", "--repeats", "1", "--max-tokens", "4",
                            "--out-dir", str(tmp_path)])
    assert f["0.5b"]["f16"]["gguf"].endswith("-f16.gguf") and f["0.5b"]["q4_k_m"]["stages"]["answer"][0]["seconds"] > 0
    assert "Q4_K_M / F16" in capsys.readouterr().out


def test_help_description_is_the_docstrings_whole_first_paragraph():
    from benchmarks.results_io import cli_description

    doc = "Local model serving: seconds per call for each\nstage's prompt, with and without reuse.\n\nusage: ..."
    assert cli_description(doc) == ("Local model serving: seconds per call for each stage's prompt, with and without "
                                    "reuse.")
    assert cli_description(None) == ""
    assert cli_description(local_serving.__doc__).endswith(".")  # not cut at the docstring's first line break
