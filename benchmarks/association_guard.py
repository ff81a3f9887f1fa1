"""The association guard (``association_min_similarity``, our floor before P_sel, §3.2.3) measured on LoCoMo, no LLM.

P_sel picks, among the top K_e = 5 earlier episodes most similar to a new one, the one it continues (or none);
P_int then merges them. With a small model P_sel merges unrelated sessions, so a cosine floor keeps dissimilar
candidates away from it — but the floor must not exclude the sessions a new one really continues. This measures,
per candidate floor, how the floor splits pairs of LoCoMo sessions of one conversation:

* unit: one session, embedded as the pipeline embeds an episode (``cue ‖ narrative``). ``--unit summary`` (default)
  uses LoCoMo's ``session_summary`` as the narrative (a third-person account of the session, as P_nar writes);
  ``--unit window`` uses each ``--window``-turn run of "speaker: text" lines (a topic-sized piece of raw dialogue)
  and scores a session pair by its best window pair;
* continuation (should reach P_sel): an earlier and a later session that some scored question's evidence both
  names (``D<session>:<turn>`` ids in both);
* unrelated (should not): two sessions of the same conversation that no question's evidence joins.

For each floor it prints the share of continuation pairs at or above it (recall), the share of pairs above it that
are continuations (precision), the share of unrelated pairs it lets through, and — as the pipeline runs — among the
top K_e earlier sessions of every later session: how many continuations still reach P_sel and how often no
candidate is left (no P_sel call). The suggested floor is the highest one that keeps ``--min-recall`` (default 0.8)
of the continuations among the top K_e. Writes ``benchmarks/results/association_guard-<unit>-<embedder>.json``.

usage: python -m benchmarks.association_guard --data ../shared/data/locomo/locomo10.json [--unit summary|window]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Conversation", "conversations", "continuations", "sweep", "suggest", "auc", "main", "FLOORS", "TOP_K"]

#: K_e, candidates P_sel sees at most (§3.2.3, §4.1).
TOP_K = 5
#: candidate floors swept (cosine).
FLOORS = [round(f, 2) for f in np.arange(0.20, 0.81, 0.05)]
_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"D(\d+):\d+")


@dataclass
class Conversation:
    """One sample's sessions (number → texts to embed) and its continuation pairs (earlier, later)."""

    sample_id: str
    texts: dict[int, list[str]]
    pairs: set[tuple[int, int]] = field(default_factory=set)


def continuations(sample: dict) -> set[tuple[int, int]]:
    """(earlier, later) session pairs that one scored question's evidence both names (categories 1-4)."""
    out: set[tuple[int, int]] = set()
    for qa in sample.get("qa", []):
        if qa.get("category") not in (1, 2, 3, 4):
            continue
        sessions = sorted({int(m.group(1)) for e in qa.get("evidence", []) for m in _DIA.finditer(str(e))})
        out |= {(a, b) for i, a in enumerate(sessions) for b in sessions[i + 1:]}
    return out


def conversations(samples: list[dict], unit: str = "summary", window: int = 10) -> list[Conversation]:
    """The sessions of every sample as texts to embed (see the module docstring for ``unit``).

    Raises:
        ValueError: ``unit`` is neither ``summary`` nor ``window``.
    """
    if unit not in ("summary", "window"):
        raise ValueError(f"unknown unit {unit!r}; use 'summary' or 'window'")
    out = []
    for sample in samples:
        conv, texts = sample["conversation"], {}
        for key, turns in conv.items():
            m = _SESSION.match(key)
            if not m or not isinstance(turns, list) or not turns:
                continue
            n = int(m.group(1))
            if unit == "summary":
                summary = sample.get("session_summary", {}).get(f"session_{n}_summary")
                if summary:
                    texts[n] = [str(summary)]
            else:
                lines = [f"{t['speaker']}: {t.get('text', '')}" for t in turns]
                texts[n] = ["\n".join(lines[i:i + window]) for i in range(0, len(lines), window)]
        known = set(texts)
        pairs = {p for p in continuations(sample) if p[0] in known and p[1] in known}
        out.append(Conversation(str(sample.get("sample_id", len(out))), texts, pairs))
    return out


def _session_sims(conv: Conversation, embed) -> dict[tuple[int, int], float]:
    """Cosine of every (earlier, later) session pair: the best pair of their texts."""
    order = sorted(conv.texts)
    flat = [(n, t) for n in order for t in conv.texts[n]]
    vec = np.asarray(embed([t for _, t in flat]), dtype=np.float32)
    owner = np.array([n for n, _ in flat])
    sims = vec @ vec.T
    out = {}
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            out[(a, b)] = float(sims[np.ix_(owner == a, owner == b)].max())
    return out


def sweep(convs: list[Conversation], sims: list[dict[tuple[int, int], float]], floors: list[float],
          k: int = TOP_K) -> list[dict]:
    """Per floor: over all pairs, recall of continuations, precision, share of unrelated pairs let through; among
    the top-``k`` earlier sessions of each later session, recall of continuations and the share of later sessions
    with no candidate left (of those with any earlier session)."""
    rows = []
    for floor in floors:
        tp = fp = pos = neg = top_tp = top_pos = empty = later = 0
        for conv, s in zip(convs, sims):
            for pair, cos in s.items():
                is_pos = pair in conv.pairs
                pos += is_pos
                neg += not is_pos
                if cos >= floor:
                    tp += is_pos
                    fp += not is_pos
            for b in sorted(conv.texts):
                earlier = sorted(((s[(a, b)], a) for a in conv.texts if a < b), reverse=True)[:k]
                if not earlier:
                    continue
                later += 1
                kept = [a for cos, a in earlier if cos >= floor]
                empty += not kept
                top_pos += sum((a, b) in conv.pairs for _, a in earlier)
                top_tp += sum((a, b) in conv.pairs for a in kept)
        rows.append({"floor": floor, "recall": tp / pos if pos else 0.0,
                     "precision": tp / (tp + fp) if tp + fp else 0.0, "unrelated_through": fp / neg if neg else 0.0,
                     "topk_recall": top_tp / top_pos if top_pos else 0.0,
                     "no_candidate_share": empty / later if later else 0.0,
                     "continuations": pos, "unrelated": neg, "topk_continuations": top_pos})
    return rows


def auc(positives: np.ndarray, negatives: np.ndarray) -> float:
    """Probability that a continuation pair's cosine exceeds an unrelated pair's (ties count half): 0.5 = the
    cosine cannot tell them apart, 1.0 = a floor separates them perfectly."""
    if not len(positives) or not len(negatives):
        return float("nan")
    neg = np.sort(np.asarray(negatives, dtype=float))
    pos = np.asarray(positives, dtype=float)
    below, upto = np.searchsorted(neg, pos, side="left"), np.searchsorted(neg, pos, side="right")
    return float((below + 0.5 * (upto - below)).sum() / (len(pos) * len(neg)))


def suggest(rows: list[dict], min_recall: float) -> dict:
    """The highest floor whose top-K_e recall of continuations is at least ``min_recall`` (else the lowest floor)."""
    ok = [r for r in rows if r["topk_recall"] >= min_recall]
    return max(ok, key=lambda r: r["floor"]) if ok else min(rows, key=lambda r: r["floor"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="locomo10.json (needs session_summary for --unit summary)")
    ap.add_argument("--unit", choices=["summary", "window"], default="summary", help="what stands for an episode")
    ap.add_argument("--window", type=int, default=10, help="--unit window: turns per window")
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="an embedder name NemoriSettings accepts")
    ap.add_argument("--min-recall", type=float, default=0.8, help="continuations among the top K_e the floor keeps")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    from benchmarks.results_io import table, write_result
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    convs = [c for c in conversations(json.loads(args.data.read_text()), args.unit, args.window) if len(c.texts) > 1]
    if not convs:
        raise SystemExit(f"{args.data}: no conversation with two sessions to compare (--unit {args.unit}). Fix: use "
                         "locomo10.json (its session_summary annotations cover every session) or --unit window.")
    embedder = resolve_embedder(NemoriSettings(embedder=args.embedder))
    sims = [_session_sims(c, embedder.embed) for c in convs]
    rows = sweep(convs, sims, FLOORS)
    best = suggest(rows, args.min_recall)
    default = NemoriSettings().association_min_similarity
    pos = np.array([v for c, s in zip(convs, sims) for p, v in s.items() if p in c.pairs])
    neg = np.array([v for c, s in zip(convs, sims) for p, v in s.items() if p not in c.pairs])
    q = lambda a: " / ".join(f"{np.percentile(a, p):.3f}" for p in (10, 25, 50, 75, 90)) if len(a) else "-"  # noqa: E731
    print(f"embedder {embedder.name}, unit {args.unit}: {len(convs)} conversations, {len(pos)} continuation and "
          f"{len(neg)} unrelated session pairs")
    print(f"cosine p10 / p25 / median / p75 / p90: continuation {q(pos)};  unrelated {q(neg)};  "
          f"AUC {auc(pos, neg):.3f} (0.5 = no separation)")
    print(table(["floor", "recall (all pairs)", "precision", "unrelated let through", f"recall in top K_e={TOP_K}",
                 "later sessions with no candidate"],
                [[f"{r['floor']:.2f}" + (" ←" if r is best else "") + (" (default)" if r["floor"] == default else ""),
                  f"{100 * r['recall']:.1f}", f"{100 * r['precision']:.1f}", f"{100 * r['unrelated_through']:.1f}",
                  f"{100 * r['topk_recall']:.1f}", f"{100 * r['no_candidate_share']:.1f}%"] for r in rows]))
    print(f"suggested floor for {embedder.name}: {best['floor']:.2f} (highest keeping >= {100 * args.min_recall:.0f}% "
          f"of the continuations among the top K_e)")
    figures = {"rows": rows, "suggested_floor": best["floor"], "default_floor": default, "auc": auc(pos, neg),
               "continuation_cosine": {p: float(np.percentile(pos, p)) for p in (10, 25, 50, 75, 90)} if len(pos) else {},
               "unrelated_cosine": {p: float(np.percentile(neg, p)) for p in (10, 25, 50, 75, 90)} if len(neg) else {}}
    path = write_result(f"association_guard-{args.unit}-{embedder.name.replace('/', '_')}",
                        {"data": str(args.data), "unit": args.unit, "window": args.window, "embedder": embedder.name,
                         "top_k": TOP_K, "min_recall": args.min_recall}, figures, args.out)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
