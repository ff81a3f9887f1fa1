"""The consolidation floor (``consolidation_min_similarity``, our guard before P_con, §3.3.3) on labelled pairs.

P_con sees an insight only with the existing entries whose cosine to it is at or above the floor. The floor must
let one person's changed or refined fact reach P_con (so the old value can be merged or retired) and keep facts
about other people or other topics away from it (so the small model cannot delete a true fact). The pairs are
hand-written and synthetic (``tests/data/consolidation_pairs.jsonl``: ``existing``, ``insight``,
``should_reach_p_con``, ``kind`` in update | refinement | different_person | different_topic | same_template).

What is embedded is what the pipeline embeds: the bare insight text (``SemanticDistillation._prepare``:
``embed(insight)``) against the stored entry's vector, itself ``embed(text)`` of the bare fact; the date prefix of
``formatting.render_fact`` is only in P_con's prompt, never in a vector.

For each candidate floor it prints how many pairs of each kind reach P_con (cosine >= floor), the recall of the
pairs that should and the leak of those that should not. The suggested floor is the highest one at which every
``update`` pair reaches P_con (a missed update leaves a stale fact live), ties broken towards fewer leaks.
Writes ``benchmarks/results/consolidation_floor-<embedder>.json`` with the machine description.

``--topic`` runs the whole candidate path of ``SemanticDistillation._prepare`` instead: the plain floor at its
default, then the same-person guard (``same_person_candidates``; a pair's speakers are the names its two sentences
open with), then the name-masked topic floor (``consolidation_topic_floor``: cosine of the two texts with the
speakers' names masked by ``insight_rules.mask_people``), swept; it writes ``consolidation_floor-<embedder>-topic.json``.

usage: python -m benchmarks.consolidation_floor [--pairs tests/data/consolidation_pairs.jsonl]
       [--embedder all-MiniLM-L6-v2] [--topic]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Pair", "KINDS", "DEFAULT_PAIRS", "FLOORS", "load_pairs", "cosines", "pair_speakers", "topic_cosines",
           "sweep", "suggest", "main"]

DEFAULT_PAIRS = Path(__file__).resolve().parent.parent / "tests" / "data" / "consolidation_pairs.jsonl"
#: pair kinds in print order; the first two should reach P_con, the others should not.
KINDS = ("update", "refinement", "different_person", "different_topic", "same_template")
#: candidate floors swept (cosine).
FLOORS = [round(f, 2) for f in np.arange(0.20, 0.71, 0.05)]


@dataclass(frozen=True)
class Pair:
    """One labelled pair: an entry already in memory, a new insight, whether P_con must see them together."""

    existing: str
    insight: str
    should_reach_p_con: bool
    kind: str


def load_pairs(path: Path) -> list[Pair]:
    """The pairs of a JSONL file (one object per line; blank lines skipped).

    Raises:
        ValueError: a line lacks a field, names an unknown kind, or its label disagrees with its kind.
    """
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            pair = Pair(str(row["existing"]), str(row["insight"]), bool(row["should_reach_p_con"]), str(row["kind"]))
        except KeyError as exc:
            raise ValueError(f"{path}:{n}: missing field {exc}") from None
        if pair.kind not in KINDS:
            raise ValueError(f"{path}:{n}: unknown kind {pair.kind!r}; use one of {', '.join(KINDS)}")
        if pair.should_reach_p_con != (pair.kind in KINDS[:2]):
            raise ValueError(f"{path}:{n}: kind {pair.kind!r} with should_reach_p_con={pair.should_reach_p_con}")
        out.append(pair)
    return out


def cosines(pairs: list[Pair], embed) -> np.ndarray:
    """Cosine of each pair's insight to its existing entry; ``embed(texts) -> unit vectors``."""
    a = np.asarray(embed([p.existing for p in pairs]), dtype=np.float32)
    b = np.asarray(embed([p.insight for p in pairs]), dtype=np.float32)
    return np.einsum("ij,ij->i", a, b)


#: sentence openers that are no one's name (the pairs' other sentences open with the person they are about).
_OPENERS = frozenset({"the", "a", "an", "every", "our", "my", "his", "her", "their"})


def pair_speakers(pair: Pair) -> set[str]:
    """The case-folded names the pair's two sentences open with ("Dev's favourite band …" → ``{"dev"}``), standing
    in for the conversation's speakers that the pipeline masks; openers such as "The" are no one's name."""
    names = set()
    for text in (pair.existing, pair.insight):
        first = text.split()[0].removesuffix("'s").removesuffix("’s")
        if first[:1].isupper() and first.casefold() not in _OPENERS:
            names.add(first.casefold())
    return names


def topic_cosines(pairs: list[Pair], embed, plain: np.ndarray, plain_floor: float) -> np.ndarray:
    """Per pair, what the topic floor is compared with on the pipeline's candidate path, or -1 when the pair never
    gets that far: below ``plain_floor`` (plain cosine) or left out by the same-person guard. Else the cosine of
    the two texts with the pair's speakers masked (``insight_rules.mask_people``), as ``_same_topic`` computes it."""
    from nemori_dspy.insight_rules import mask_people
    from nemori_dspy.modules.semantic import same_person_candidates
    from nemori_dspy.types import SemanticEntry

    out = np.full(len(pairs), -1.0, dtype=np.float32)
    for i, (pair, sim) in enumerate(zip(pairs, plain)):
        speakers = pair_speakers(pair)
        entry = SemanticEntry(id="e", user_id="u", text=pair.existing, vector=[0.0], source_episode_ids=["ep"])
        if sim < plain_floor or not same_person_candidates(pair.insight, [(entry, float(sim))], speakers):
            continue
        a, b = np.asarray(embed([mask_people(pair.existing, speakers), mask_people(pair.insight, speakers)]))
        out[i] = float(a @ b)
    return out


def sweep(pairs: list[Pair], sims: np.ndarray, floors: list[float]) -> list[dict]:
    """Per floor: pairs of each kind that reach P_con (cosine >= floor), recall of the positives, leaked negatives."""
    rows = []
    for floor in floors:
        passed = sims >= floor
        by_kind = {k: int(sum(ok for ok, p in zip(passed, pairs) if p.kind == k)) for k in KINDS}
        pos = [ok for ok, p in zip(passed, pairs) if p.should_reach_p_con]
        neg = [ok for ok, p in zip(passed, pairs) if not p.should_reach_p_con]
        rows.append({"floor": floor, "reach": by_kind, "recall": sum(pos) / len(pos) if pos else 0.0,
                     "leaked": int(sum(neg)), "negatives": len(neg)})
    return rows


def suggest(rows: list[dict], updates: int) -> dict:
    """The highest floor at which all ``updates`` update pairs reach P_con (else the floor reaching the most)."""
    return max(rows, key=lambda r: (r["reach"]["update"] >= updates, r["reach"]["update"], -r["leaked"], r["floor"]))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS, help="labelled pairs (JSONL)")
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="an embedder name NemoriSettings accepts")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--topic", action="store_true", help="sweep consolidation_topic_floor on the whole candidate "
                    "path (plain floor at its default, same-person guard, names masked)")
    args = ap.parse_args(argv)

    from benchmarks.results_io import table, write_result
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    pairs = load_pairs(args.pairs)
    embedder = resolve_embedder(NemoriSettings(embedder=args.embedder))
    sims = cosines(pairs, embedder.embed)
    settings = NemoriSettings()
    default = settings.consolidation_min_similarity
    what = "consolidation_min_similarity"
    if args.topic:
        sims = topic_cosines(pairs, embedder.embed, sims, default)
        default, what = settings.consolidation_topic_floor, "consolidation_topic_floor"
        print(f"candidate path: plain cosine >= {settings.consolidation_min_similarity}, same-person guard, then the "
              f"name-masked cosine (-1: the pair stopped before it)")
    rows = sweep(pairs, sims, FLOORS)
    n_kind = {k: sum(p.kind == k for p in pairs) for k in KINDS}
    best = suggest(rows, n_kind["update"])
    print(f"embedder {embedder.name}: {len(pairs)} pairs ({', '.join(f'{k} {n}' for k, n in n_kind.items())}); "
          f"swept: {what}")
    print(table(["kind", "n", "min", "median", "max"],
                [[k, n_kind[k], *(f"{f(sims[[p.kind == k for p in pairs]]):.3f}" for f in (np.min, np.median, np.max))]
                 for k in KINDS if n_kind[k]]))
    print()
    print(table(["floor", *KINDS, "recall of should-reach", "negatives leaked"],
                [[f"{r['floor']:.2f}" + (" ←" if r is best else "") + (" (default)" if r["floor"] == default else ""),
                  *(f"{r['reach'][k]}/{n_kind[k]}" for k in KINDS), f"{100 * r['recall']:.0f}%",
                  f"{r['leaked']}/{r['negatives']}"] for r in rows]))
    print(f"suggested {what} for {embedder.name}: {best['floor']:.2f} (highest with every update pair reaching P_con)")
    figures = {"rows": rows, "suggested_floor": best["floor"], "default_floor": default,
               "pairs": [{"kind": p.kind, "cosine": round(float(s), 4)} for p, s in zip(pairs, sims)]}
    path = write_result(f"consolidation_floor-{embedder.name.replace('/', '_')}" + ("-topic" if args.topic else ""),
                        {"pairs": str(args.pairs), "embedder": embedder.name, "n": len(pairs), "swept": what},
                        figures, args.out)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
