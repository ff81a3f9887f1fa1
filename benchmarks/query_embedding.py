"""Query-embedding latency: one query at a time through the default embedder, torch vs ONNX Runtime.

Both routes of all-MiniLM-L6-v2 (``nemori_dspy.embedders``): sentence-transformers on torch and fastembed on
ONNX Runtime (``<model folder>/onnx/`` from ``python -m nemori_dspy.onnx_export``). Each is loaded in this
process, warmed up, then embeds ``--queries`` LoCoMo-style questions one by one; p50/p95 of a single call
and the load time are printed beside the speed target (p50 <= 8 ms for the query embedding inside a
search whose p50 is <= 8 ms). Also the cosine between the two routes' vectors (>= 0.999 required).

usage: python -m benchmarks.query_embedding [--queries 200] [--backends torch,onnx,onnx-fastembed]
Needs the local model folder (~/.cache/nemori-offline-models/all-MiniLM-L6-v2 or $NEMORI_EMBEDDER_PATH).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from benchmarks.results_io import cli_description, percentile_ms, table, write_result
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import find_minilm_dir, resolve_embedder

__all__ = ["TARGET_P50_MS", "questions", "time_backend", "run", "main"]

TARGET_P50_MS = 8.0
_WHO = ("Caroline", "Melanie", "Jon", "Gina")
_WHAT = ("go to the LGBTQ support group", "start the pottery class", "run the charity race", "buy the new car",
         "visit her grandmother", "lose her job", "paint the sunrise", "adopt the puppy")


def questions(n: int) -> list[str]:
    """``n`` distinct LoCoMo-style questions (deterministic)."""
    return [f"When did {_WHO[i % 4]} {_WHAT[(i // 4) % 8]}{'' if i < 32 else f' for the {i}th time'}?"
            for i in range(n)]


def _fastembed_one(emb: Any) -> Any:
    """One text through fastembed's own batching path (the ONNX embedder's route for batches), for comparison."""
    return lambda texts: np.stack(list(emb._model.embed(list(texts))))


def time_backend(backend: str, qs: list[str], warmup: int = 10) -> tuple[dict[str, Any], np.ndarray]:
    """Load the ``backend`` route, warm it up, time one call per question; returns (figures, vectors).
    ``onnx-fastembed`` is the ONNX route's model through fastembed's batch path (what a query cost before the
    single-text path, ``OnnxMiniLMEmbedder._single``)."""
    t0 = time.perf_counter()
    emb = resolve_embedder(NemoriSettings(embedder_backend=backend.split("-")[0], _env_file=None))
    load_s = time.perf_counter() - t0
    embed = _fastembed_one(emb) if backend == "onnx-fastembed" else emb.embed
    for q in qs[:warmup]:
        embed([q])
    times, vecs = [], []
    for q in qs:
        t = time.perf_counter()
        vecs.append(embed([q])[0])
        times.append(time.perf_counter() - t)
    return ({"class": type(emb).__name__, "load_s": load_s, "p50_ms": percentile_ms(times, 50),
             "p95_ms": percentile_ms(times, 95), "mean_ms": 1000 * float(np.mean(times)), "queries": len(qs)},
            np.stack(vecs))


def run(n: int, backends: list[str]) -> dict[str, Any]:
    """Figures per backend, and the least cosine between the first two backends' vectors."""
    qs = questions(n)
    out: dict[str, Any] = {}
    vectors = []
    for b in backends:
        out[b], v = time_backend(b, qs)
        vectors.append(v)
    if len(vectors) >= 2:
        out["min_cosine"] = float((vectors[0] * vectors[1]).sum(axis=1).min())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table, write ``results/query_embedding.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--backends", default="torch,onnx,onnx-fastembed", help="comma-separated: torch, onnx, "
                    "onnx-fastembed (the ONNX model through fastembed's batch path)")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    if find_minilm_dir(None) is None:
        raise SystemExit("no local all-MiniLM-L6-v2 folder (run ../shared/tools/offline-models or .ci/setup)")
    f = run(a.queries, [b.strip() for b in a.backends.split(",") if b.strip()])
    rows = [[b, f[b]["class"], f"{f[b]['load_s']:.2f}", f"{f[b]['p50_ms']:.2f}", f"{f[b]['p95_ms']:.2f}",
             f"<= {TARGET_P50_MS:.0f}"] for b in f if b != "min_cosine"]
    print(table(["backend", "embedder", "load (s)", "p50 (ms)", "p95 (ms)", "p50 target (ms)"], rows))
    if "min_cosine" in f:
        print(f"least cosine between the two routes over {a.queries} queries: {f['min_cosine']:.6f} (need >= 0.999)")
    print(f"written {write_result('query_embedding', vars(a), f, a.out_dir)}")
    return f


if __name__ == "__main__":
    main()
