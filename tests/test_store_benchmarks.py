"""The store benchmarks run at toy size (so they cannot rot); no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.lexical_fusion import recall_table
from benchmarks.store_search import build, measure

DATA = Path(__file__).parent / "data"


def test_store_search_benchmark_measures_every_figure(tmp_path):
    path = tmp_path / "bench.db"
    assert build(path, 60, 8) >= 0
    r = measure(path, 8, 4)
    assert set(r) == {"first_ms", "first_rebuild_ms", "cosine_p50_ms", "cosine_p95_ms", "fused_p50_ms",
                      "fused_p95_ms", "after_write_p50_ms", "after_write_p95_ms"}
    assert all(v >= 0 for v in r.values())


def test_lexical_fusion_benchmark_gives_a_recall_per_weight():
    r = recall_table([DATA / "synthetic_mini.json"], [1, 5], [0.0, 0.3], "hashing-64")
    assert r["questions"] > 0 and r["turns"] > 0
    assert set(r["weights"]) == {0.0, 0.3}
    assert all(0.0 <= v <= 1.0 for rec in r["weights"].values() for v in rec.values())


def _has_onnx_minilm() -> bool:
    from nemori_dspy.embedders import find_minilm_dir, find_minilm_onnx_dir

    d = find_minilm_dir(None)
    return d is not None and find_minilm_onnx_dir(d) is not None


@pytest.mark.skipif(not _has_onnx_minilm(), reason="model download: local all-MiniLM-L6-v2 with its onnx/ folder "
                    "(.ci/setup writes both)")
def test_end_to_end_search_embeds_the_question_and_searches(tmp_path):
    from benchmarks.store_search import measure_end_to_end, questions

    path = tmp_path / "bench.db"
    build(path, 50, 384)
    r = measure_end_to_end(path, 5)
    assert "OnnxMiniLMEmbedder" in r["embedder"] and r["lexical_weight"] == 0.3
    assert r["end_to_end_p50_ms"] > 0 and r["embed_p50_ms"] > 0
    assert len(set(questions(6))) == 6 and all(q.endswith("?") for q in questions(6))
