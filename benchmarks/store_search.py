"""Search latency of the embedded SQLite store at 1k / 10k / 100k entries per user.

usage: python -m benchmarks.store_search [--sizes 1000 10000 100000] [--dim 384] [--queries 200] [--embedder]
       python -m benchmarks.store_search --db FILE --size N --first-only   (one open + first search, for
                                                                            whole-process timing)

Each size stores N episodes and N semantic entries for one user (random unit vectors, short random
English texts), then times the answer-path search (episodic top-10 + semantic top-20 + fetching the
records) with a **precomputed query vector**: the query embedding is not included (timed separately
by the embedder's benchmark). Figures: the first search after opening the store (it loads the
index), then p50/p95 of warm searches, cosine-only and fused with the lexical match
(``lexical_weight`` 0.3), and of a search right after one write (the incremental index update).
The OS page cache is warm (the file was just written). "first search, rebuild" is the first search
when the index files are missing (they are rebuilt from SQLite). With ``--embedder``, the answer path's
retrieval is timed as the eval reports ``search_ms``: the default embedder embeds a LoCoMo-like question,
then the fused search runs (``ResponseGeneration.retrieve``). Prints a table with the speed targets
beside the figures; writes JSON + the machine to benchmarks/results/store_search.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_io import cli_description
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, SemanticEntry

__all__ = ["build", "measure", "measure_end_to_end", "questions", "main", "TARGETS"]

#: targets: p50 ≤ 8 ms / p95 ≤ 15 ms at 10k entries per user, ≤ 20 ms at 100k; first search ≤ 100 ms at 100k.
TARGETS = {10_000: {"p50": 8.0, "p95": 15.0}, 100_000: {"p50": 20.0, "first": 100.0}}
#: 3,000 random 4–9 letter words drawn uniformly: a query word occurs in ~0.5% of texts. Real text has
#: common words and names that match far more often; the fused figure grows with the matches.
_WORDS = ["".join(np.random.default_rng(i).choice(list("abcdefghijklmnopqrstuvwxyz"), size=4 + i % 6))
          for i in range(3000)]
_USER = "bench-user"
_BATCH = 5000


def _text(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(_WORDS, size=n))


def build(path: Path, n: int, dim: int, seed: int = 0) -> float:
    """Store ``n`` episodes and ``n`` semantic entries for one user; returns seconds taken."""
    rng = np.random.default_rng(seed)
    store = SQLiteStore(path)
    ts = datetime(2023, 1, 1)
    t0 = time.perf_counter()
    for start in range(0, n, _BATCH):
        stop = min(n, start + _BATCH)
        vecs = rng.normal(size=(stop - start, dim)).astype(np.float32)
        eps = [Episode(id=f"e{i}", user_id=_USER, cue=_text(rng, 3), narrative=_text(rng, 12), message_ids=[],
                       start=ts, end=ts, vector=v.tolist(), window=start // _BATCH)
               for i, v in zip(range(start, stop), vecs)]
        store.commit_window(_USER, store.next_window(_USER), eps, [])
        facts = [SemanticEntry(id=f"s{i}", user_id=_USER, text=_text(rng, 8), vector=v.tolist(), created_at=ts)
                 for i, v in zip(range(start, stop), vecs[::-1])]
        store.commit_distillation(_USER, f"e{start}", facts, [])
    _search(store, rng.normal(size=dim).tolist(), None)  # as construction's searches do: the index files exist
    store.close()
    return time.perf_counter() - t0


def _search(store: SQLiteStore, q: list[float], text: str | None) -> None:
    if hasattr(store, "search"):  # the one-pass answer-path search
        store.search(_USER, q, 10, 20, query=text)
    else:  # a store without it (the version before): the two searches
        store.search_episodes(_USER, q, 10)
        store.search_semantic(_USER, q, 20)


def first_search_ms(path: Path, dim: int, lexical_weight: float = 0.0) -> float:
    """Open the store and time its first search (loads the index), in ms."""
    store = SQLiteStore(path, lexical_weight=lexical_weight) if lexical_weight else SQLiteStore(path)
    q = np.random.default_rng(99).normal(size=dim).tolist()
    t0 = time.perf_counter()
    _search(store, q, None)
    ms = (time.perf_counter() - t0) * 1000
    store.close()
    return ms


def _percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}


def measure(path: Path, dim: int, queries: int) -> dict[str, float]:
    """First search after open, warm p50/p95 (cosine only; fused), and p50/p95 right after one write (ms)."""
    index_dir = Path(str(path) + ".index")
    out = {"first_ms": first_search_ms(path, dim)}
    if index_dir.is_dir():  # without the index files: rebuilt from the database's blobs
        for f in index_dir.iterdir():
            f.unlink()
        out["first_rebuild_ms"] = first_search_ms(path, dim)
    rng = np.random.default_rng(7)
    qs = rng.normal(size=(queries, dim)).astype(np.float32)
    texts = [_text(rng, 4) for _ in range(queries)]
    for label, weight in (("cosine", 0.0), ("fused", 0.3)):
        store = SQLiteStore(path, lexical_weight=weight)
        _search(store, qs[0].tolist(), None)
        times = []
        for q, t in zip(qs, texts):
            t0 = time.perf_counter()
            _search(store, q.tolist(), t if weight else None)
            times.append((time.perf_counter() - t0) * 1000)
        out.update({f"{label}_{k}_ms": v for k, v in _percentiles(times).items()})
        store.close()
    store, times = SQLiteStore(path), []
    _search(store, qs[0].tolist(), None)
    for i, q in enumerate(qs[: max(1, queries // 4)]):
        store.commit_distillation(_USER, "e0", [SemanticEntry(id=f"w{i}", user_id=_USER, text="late fact",
                                                              vector=q.tolist())], [])
        t0 = time.perf_counter()
        _search(store, q.tolist(), None)
        times.append((time.perf_counter() - t0) * 1000)
    out.update({f"after_write_{k}_ms": v for k, v in _percentiles(times).items()})
    store.close()
    return out


#: question shapes of LoCoMo (who/when/what/where about a named person), filled with random names and words.
_QUESTIONS = ["When did {n} go to the {w} support group?", "What did {n} paint after the {w} trip?",
              "Where did {n} and {m} meet in June 2023?", "Why did {n} start learning the {w}?",
              "How many {w} does {n} have?", "What does {m} think about {n}'s {w}?"]
_NAMES = ["Caroline", "Melanie", "Jon", "Gina", "Audrey", "Andrew", "John", "Maria", "Deborah", "Jolene"]


def questions(queries: int, seed: int = 11) -> list[str]:
    """``queries`` LoCoMo-like questions (a template, two names, one of the stored texts' words)."""
    rng = np.random.default_rng(seed)
    return [_QUESTIONS[i % len(_QUESTIONS)].format(n=rng.choice(_NAMES), m=rng.choice(_NAMES), w=rng.choice(_WORDS))
            for i in range(queries)]


def measure_end_to_end(path: Path, queries: int) -> dict[str, Any]:
    """The answer path's retrieval as the eval times it (``ResponseGeneration.retrieve``: the default embedder
    embeds the question, then the fused episodic + semantic search), p50/p95 in ms, and the embedding alone."""
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder
    from nemori_dspy.memory import Memory

    settings = NemoriSettings(_env_file=None)
    embedder = resolve_embedder(settings)
    memory = Memory(SQLiteStore(path, lexical_weight=settings.lexical_weight), embedder, settings)
    qs = questions(queries)
    memory.pipeline.response.retrieve(_USER, qs[0])  # loads the index and the embedder's session
    total, embed = [], []
    for q in qs:
        t0 = time.perf_counter()
        embedder.embed([q])
        t1 = time.perf_counter()
        memory.pipeline.response.retrieve(_USER, q)
        total.append((time.perf_counter() - t1) * 1000)
        embed.append((t1 - t0) * 1000)
    return {"embedder": repr(embedder), "lexical_weight": settings.lexical_weight,
            **{f"end_to_end_{k}_ms": v for k, v in _percentiles(total).items()},
            **{f"embed_{k}_ms": v for k, v in _percentiles(embed).items()}}


def _target(n: int, key: str) -> str:
    t = TARGETS.get(n, {}).get(key)
    return f"≤ {t:g}" if t is not None else "—"


def _table(rows: list[dict]) -> None:
    print("| entries per user (episodes + facts each) | build (s) | first search after open (ms) | target "
          "| first search, rebuild (ms) "
          "| cosine p50 / p95 (ms) | target p50 / p95 | fused p50 / p95 (ms) | after one write p50 / p95 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["n"]
        rebuild = f"{r['first_rebuild_ms']:.1f}" if "first_rebuild_ms" in r else "—"
        print(f"| {n:,} | {r['build_s']:.1f} | {r['first_ms']:.1f} | {_target(n, 'first')} | {rebuild} "
              f"| {r['cosine_p50_ms']:.2f} / {r['cosine_p95_ms']:.2f} | {_target(n, 'p50')} / {_target(n, 'p95')} "
              f"| {r['fused_p50_ms']:.2f} / {r['fused_p95_ms']:.2f} "
              f"| {r['after_write_p50_ms']:.2f} / {r['after_write_p95_ms']:.2f} |")


def _end_to_end_table(rows: list[dict]) -> None:
    print(f"\nanswer-path retrieval with the default embedder ({rows[0]['embedder']}), "
          f"lexical_weight {rows[0]['lexical_weight']}:")
    print("| entries per user | embed + fused search p50 / p95 (ms) | target p50 / p95 | embedding alone p50 / p95 (ms) |")
    print("|---|---|---|---|")
    for r in rows:
        n = r["n"]
        print(f"| {n:,} | {r['end_to_end_p50_ms']:.2f} / {r['end_to_end_p95_ms']:.2f} "
              f"| {_target(n, 'p50')} / {_target(n, 'p95')} | {r['embed_p50_ms']:.2f} / {r['embed_p95_ms']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--sizes", nargs="+", type=int, default=[1_000, 10_000, 100_000])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--db", type=Path, help="with --first-only: an existing store (built with --build-only)")
    ap.add_argument("--size", type=int, default=10_000, help="entries per user for --build-only")
    ap.add_argument("--build-only", action="store_true", help="build --db with --size entries and exit")
    ap.add_argument("--first-only", action="store_true", help="open --db, run one search, print its ms")
    ap.add_argument("--embedder", action="store_true", help="also time the answer path's retrieval with the default "
                    "embedder (question embedding + fused search, as the eval's search_ms); needs its model files")
    a = ap.parse_args()
    if a.build_only or a.first_only:
        if a.db is None:
            ap.error("--build-only / --first-only need --db FILE")
        if a.build_only:
            print(f"built {a.size:,} in {build(a.db, a.size, a.dim):.1f} s")
        else:
            print(f"first search {first_search_ms(a.db, a.dim):.1f} ms")
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.sizes:
            path = Path(tmp) / f"bench-{n}.db"
            r = {"n": n, "build_s": build(path, n, a.dim)}
            r.update(measure(path, a.dim, a.queries))
            if a.embedder:
                r.update(measure_end_to_end(path, a.queries))
            rows.append(r)
    print(f"query vector precomputed (embedding excluded); dim {a.dim}; {a.queries} queries per figure")
    _table(rows)
    if a.embedder:
        _end_to_end_table(rows)
    from benchmarks.machine import describe_machine, write_result

    write_result("store_search", {"args": vars(a) | {"db": None}, "targets": TARGETS, "rows": rows,
                                  "note": "query embedding excluded (precomputed vector); OS page cache warm",
                                  "machine": describe_machine()})


if __name__ == "__main__":
    main()
