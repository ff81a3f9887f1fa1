"""Exact cosine top-k of the embedded SQLite store: insert and search time at N × d vectors.

usage: python -m benchmarks.store_search [--n 50000] [--dim 384] [--k 10] [--queries 50]
Prints a table; targets are read by people, never asserted in unit tests.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import SemanticEntry


def run(n: int, dim: int, k: int, queries: int) -> dict[str, float]:
    """Insert ``n`` random unit vectors as semantic entries of one user, then time ``queries`` searches."""
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        t0 = time.perf_counter()
        ts = datetime(2023, 1, 1)
        for start in range(0, n, 5000):
            rows = [SemanticEntry(id=f"s{i}", user_id="u", text=f"fact {i}", vector=vecs[i].tolist(), created_at=ts)
                    for i in range(start, min(n, start + 5000))]
            store.commit_distillation("u", "ep", rows, [])
        insert_s = time.perf_counter() - t0
        q = rng.normal(size=(queries, dim)).astype(np.float32)
        t0 = time.perf_counter()
        store.search_semantic("u", q[0].tolist(), k)  # builds the in-memory index
        first_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        for v in q:
            store.search_semantic("u", v.tolist(), k)
        warm_ms = (time.perf_counter() - t0) * 1000 / queries
        return {"n": n, "dim": dim, "k": k, "insert_s": insert_s, "first_search_ms": first_ms, "search_ms": warm_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=50)
    a = ap.parse_args()
    r = run(a.n, a.dim, a.k, a.queries)
    print("| vectors | dim | top-k | insert (s) | first search, loads index (ms) | search (ms, mean) |")
    print("|---|---|---|---|---|---|")
    print(f"| {r['n']:,} | {r['dim']} | {r['k']} | {r['insert_s']:.1f} | {r['first_search_ms']:.0f} | {r['search_ms']:.1f} |")


if __name__ == "__main__":
    main()
