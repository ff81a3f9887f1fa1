"""The store benchmarks run at toy size (so they cannot rot); no timing is asserted."""

from __future__ import annotations

from pathlib import Path

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
