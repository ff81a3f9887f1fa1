"""Evidence recall@k of the store's search for each lexical weight w, on LoCoMo-schema files.

usage: python -m benchmarks.lexical_fusion [--data tests/data/synthetic_locomo.json ...] [--k 5 10]
       [--weights 0 0.1 0.2 0.3 0.5] [--embedder all-MiniLM-L6-v2]

Each dialogue turn is stored as one semantic entry of its conversation's user (text = "speaker: text",
vector = the embedder's); each question searches them (``search_semantic(query=question)``) and
recall@k is the share of its evidence turns in the top k. No LLM is involved: this measures the
retrieval step alone, the part ``lexical_weight`` changes. Prints a table; writes JSON + machine to
benchmarks/results/lexical_fusion.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.machine import describe_machine, write_result
from benchmarks.results_io import cli_description
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import resolve_embedder
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import SemanticEntry

__all__ = ["load_turns", "recall_table", "main"]


def load_turns(paths: list[Path]) -> tuple[dict[str, list[tuple[str, str]]], list[tuple[str, str, list[str]]]]:
    """(user → [(dia_id, text)], [(user, question, evidence dia_ids)]) of LoCoMo-schema files."""
    turns: dict[str, list[tuple[str, str]]] = {}
    questions = []
    for path in paths:
        for conv in json.loads(Path(path).read_text()):
            user = f"{Path(path).stem}:{conv['sample_id']}"
            c = conv["conversation"]
            turns[user] = [(t["dia_id"], f"{t['speaker']}: {t['text']}") for key, sess in c.items()
                           if key.startswith("session_") and isinstance(sess, list) for t in sess]
            questions += [(user, q["question"], list(q.get("evidence") or [])) for q in conv["qa"]
                          if q.get("evidence") and q.get("category") != 5]
    return turns, questions


def recall_table(paths: list[Path], ks: list[int], weights: list[float], embedder_name: str) -> dict:
    """Recall@k per weight: ``{"weights": {w: {k: recall}}, "questions": n, "turns": n}``."""
    embedder = resolve_embedder(NemoriSettings(embedder=embedder_name, _env_file=None))
    turns, questions = load_turns(paths)
    out: dict = {"questions": len(questions), "turns": sum(map(len, turns.values())), "weights": {}}
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "fusion.db")
        for user, rows in turns.items():
            vecs = embedder.embed([t for _, t in rows])
            store.commit_distillation(user, "e", [SemanticEntry(id=d, user_id=user, text=t, vector=v.tolist())
                                                  for (d, t), v in zip(rows, vecs)], [])
        qvecs = embedder.embed([q for _, q, _ in questions])
        for w in weights:
            store.lexical_weight = w
            rec = {k: [] for k in ks}
            for (user, q, ev), v in zip(questions, qvecs):
                got = [h.entry.id for h in store.search_semantic(user, v.tolist(), max(ks), query=q)]
                for k in ks:
                    rec[k].append(len(set(got[:k]) & set(ev)) / len(ev))
            out["weights"][w] = {k: float(np.mean(r)) for k, r in rec.items()}
        store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", nargs="+", type=Path,
                    default=[Path("tests/data/synthetic_locomo.json"), Path("tests/data/synthetic_mini.json")])
    ap.add_argument("--k", nargs="+", type=int, default=[1, 5, 10])
    ap.add_argument("--weights", nargs="+", type=float, default=[0.0, 0.1, 0.2, 0.3, 0.5])
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2")
    a = ap.parse_args()
    r = recall_table(a.data, a.k, a.weights, a.embedder)
    print(f"{r['questions']} questions over {r['turns']} turns ({', '.join(p.name for p in a.data)}; {a.embedder})")
    print("| lexical_weight | " + " | ".join(f"recall@{k}" for k in a.k) + " |")
    print("|---" * (len(a.k) + 1) + "|")
    for w, rec in r["weights"].items():
        print(f"| {w:g} | " + " | ".join(f"{rec[k]:.3f}" for k in a.k) + " |")
    name = "lexical_fusion" + ("" if all(p.parent.name == "data" and p.parts[0] == "tests" for p in a.data)
                               else "_" + "_".join(p.stem for p in a.data))
    write_result(name, {"args": {"data": [str(p) for p in a.data], "k": a.k, "embedder": a.embedder}, **r,
                        "machine": describe_machine()})


if __name__ == "__main__":
    main()
