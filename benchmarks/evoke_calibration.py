"""τ for evocation (§3.3.1) calibrated on what the pipeline itself built: its episodes against the facts it stored.

``benchmarks.evoke_threshold`` measures τ on proxies (±4-turn raw windows against LoCoMo's gold observations). This
reads a built memory instead (a SQLite store of ``eval locomo``), so τ is chosen on the vectors evocation really
compares: an episode's ``emb(cue ‖ narrative)`` against the stored semantic entries' ``emb(text)``.

* related pairs: for every scored question whose evidence spans two or more episodes of one conversation, the
  episode holding the latest evidence turn should evoke the facts distilled from the episodes holding the earlier
  evidence turns (``SemanticEntry.source_episode_ids``); the pool of an episode is every fact whose source episodes
  all started before it (evocation can only find what was stored earlier);
* for each τ: the share of episodes with a related earlier fact for which evocation returns at least one entry
  (P_ant runs, ``anticipate_without_facts`` off), the recall of the related facts within the top K_s = 10 above τ,
  and the mean number evoked. The suggested τ is the highest at which P_ant runs for ≥ ``TARGET_FIRING`` of them
  (the target) — a higher τ evokes fewer unrelated entries.

usage: python -m benchmarks.evoke_calibration --db <memory.sqlite3> --data <locomo10.json> [--conversations ...]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Probe", "probes", "sweep", "suggest", "main", "TARGET_FIRING", "TAUS"]

#: K_s (§3.3.1).
EVOKE_TOP_K = 10
#: share of episodes with a related earlier fact for which P_ant must run (the target).
TARGET_FIRING = 0.80
TAUS = [round(t, 2) for t in np.arange(0.10, 0.71, 0.05)]


@dataclass
class Probe:
    """One episode vector, the cosines of its pool facts (earlier-stored entries) and which of them are related."""

    cosines: np.ndarray
    related: np.ndarray


def _episode_of(episodes: list, dia: str) -> int | None:
    for i, ep in enumerate(episodes):
        if dia in ep.message_ids:
            return i
    return None


def probes(episodes: list, facts: list, questions: list) -> list[Probe]:
    """Probes of one conversation: ``episodes`` (live ``Episode``s with vectors), ``facts`` (live ``SemanticEntry``s),
    ``questions`` (``LoCoMoQuestion``s with ``evidence`` dia_ids). One probe per episode that holds the latest
    evidence turn of a question whose evidence spans several episodes and has at least one earlier fact."""
    episodes = sorted(episodes, key=lambda e: e.start)
    index = {ep.id: i for i, ep in enumerate(episodes)}
    related: dict[int, set[int]] = {}
    for q in questions:
        held = sorted({i for d in q.evidence if (i := _episode_of(episodes, d)) is not None})
        if len(held) >= 2:
            related.setdefault(held[-1], set()).update(held[:-1])
    out = []
    for target, sources in sorted(related.items()):
        pool = [f for f in facts if f.source_episode_ids
                and all(index.get(s, len(episodes)) < target for s in f.source_episode_ids)]
        if not pool:
            continue
        vec = np.asarray(episodes[target].vector, dtype=np.float32)
        cos = np.asarray([float(np.dot(vec, np.asarray(f.vector, dtype=np.float32))) for f in pool])
        rel = np.asarray([any(index.get(s) in sources for s in f.source_episode_ids) for f in pool])
        if rel.any():
            out.append(Probe(cos, rel))
    return out


def sweep(all_probes: list[Probe], taus: list[float] = TAUS, top_k: int = EVOKE_TOP_K) -> list[dict]:
    """Per τ: ``fires`` (share of probes evoking ≥ 1 entry), ``recall`` (related facts evoked / related facts),
    ``precision`` (related among evoked), ``evoked`` (mean entries evoked), over ``all_probes``."""
    rows = []
    for tau in taus:
        fires = hits = rel = evoked = 0
        for p in all_probes:
            order = np.argsort(-p.cosines)[:top_k]
            chosen = [i for i in order if p.cosines[i] > tau]
            fires += bool(chosen)
            hits += int(sum(p.related[i] for i in chosen))
            rel += int(p.related.sum())
            evoked += len(chosen)
        n = max(len(all_probes), 1)
        rows.append({"tau": tau, "fires": fires / n, "recall": hits / max(rel, 1),
                     "precision": hits / evoked if evoked else 0.0, "evoked": evoked / n})
    return rows


def suggest(rows: list[dict], target: float = TARGET_FIRING) -> float | None:
    """The highest τ whose ``fires`` ≥ ``target`` (None if none reaches it)."""
    ok = [r["tau"] for r in rows if r["fires"] >= target]
    return max(ok) if ok else None


def main(argv: list[str] | None = None) -> int:
    from nemori_dspy.eval.locomo import SCORED_CATEGORIES, load_locomo
    from nemori_dspy.store.sqlite import SQLiteStore

    ap = argparse.ArgumentParser(prog="python -m benchmarks.evoke_calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="SQLite memory store built by eval locomo")
    ap.add_argument("--data", required=True, help="the LoCoMo file the memory was built from")
    ap.add_argument("--conversations", help="comma-separated sample ids (default: every user in the store)")
    ap.add_argument("--out", help="write the sweep as JSON here")
    args = ap.parse_args(argv)
    store = SQLiteStore(Path(args.db))
    users = args.conversations.split(",") if args.conversations else store.list_users()
    convs = {c.sample_id: c for c in load_locomo(args.data, users)}
    all_probes: list[Probe] = []
    for user in users:
        qs = [q for q in convs[user].questions if q.category in SCORED_CATEGORIES]
        all_probes += probes(store.list_episodes(user), store.list_semantic(user), qs)
    rows = sweep(all_probes)
    print(f"{len(all_probes)} episodes with a related earlier fact ({', '.join(users)})")
    print("tau   P_ant runs  recall  precision  evoked")
    for r in rows:
        print(f"{r['tau']:.2f}  {100 * r['fires']:9.1f}  {100 * r['recall']:6.1f}  {100 * r['precision']:9.1f}  "
              f"{r['evoked']:6.2f}")
    print(f"suggested tau (highest with P_ant for >= {TARGET_FIRING:.0%}): {suggest(rows)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"probes": len(all_probes), "sweep": rows, "suggested": suggest(rows)},
                                             indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
