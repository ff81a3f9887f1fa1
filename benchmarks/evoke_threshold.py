"""τ for evocation (§3.3.1) per embedder, measured on LoCoMo: how similar is an episode to the facts it should evoke?

The paper's τ = 0.70 was tuned for text-embedding-3-small. This measures, for another embedder, the cosine
between an episode and the earlier facts it should bring back, against the cosine to the user's other earlier facts:

* facts: LoCoMo's annotated ``observation`` entries (one sentence, with the ``dia_id`` it came from);
* "should evoke": for every scored question whose evidence spans two or more sessions, the episode around the
  latest evidence turn (``--half`` turns either side, "speaker: text" lines — a proxy for the cue + narrative the
  pipeline embeds) should evoke the observations of the question's earlier evidence turns;
* pool: all observations of the same conversation from earlier sessions (evocation searches one user's memory).

For each τ it prints the recall of the facts to evoke (cosine > τ and within the top K_s = 10), the mean number
of entries evoked, and how often nothing was evoked; the suggested τ is the one with the best F1 of "to evoke"
against "evoked" — the highest τ whose F1 is within ``F1_TIE`` points of the best, since at equal quality a
higher τ evokes fewer entries (fewer P_ant prompt tokens). Writes JSON with the machine description to ``benchmarks/results/``.

usage: python -m benchmarks.evoke_threshold --data ../shared/data/locomo/locomo10.json [--embedder all-MiniLM-L6-v2]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Probe", "probes", "sweep", "main"]

#: K_s, entries evoked at most (§3.3.1).
EVOKE_TOP_K = 10
#: turns either side of the evidence turn that make up the probe episode (episodes average ~8-10 turns here).
HALF_WINDOW = 4
#: F1 points (×100) within which two τ count as tied; the higher τ is suggested.
F1_TIE = 1.0
TAUS = [round(t, 2) for t in np.arange(0.20, 0.81, 0.05)]
_SESSION = re.compile(r"^D(\d+):")


@dataclass
class Probe:
    """One episode text, the indices of the pool facts it should evoke, and the pool (earlier facts)."""

    episode: str
    positives: list[int]
    pool: list[int]


def _session(dia_id: str) -> int | None:
    m = _SESSION.match(dia_id)
    return int(m.group(1)) if m else None


def _facts(sample: dict) -> list[tuple[str, str]]:
    """(text, dia_id) of every observation of a sample (list-valued dia_ids give one row each)."""
    out = []
    for obs in sample.get("observation", {}).values():
        for rows in obs.values():
            for text, dia in rows:
                for d in dia if isinstance(dia, list) else [dia]:
                    out.append((str(text), str(d)))
    return out


def _turns(sample: dict) -> dict[str, tuple[int, int, str]]:
    """dia_id → (session, position in session, "speaker: text")."""
    conv, out = sample["conversation"], {}
    for key, turns in conv.items():
        m = re.fullmatch(r"session_(\d+)", key)
        if not m or not isinstance(turns, list):
            continue
        for pos, t in enumerate(turns):
            out[t["dia_id"]] = (int(m.group(1)), pos, f"{t['speaker']}: {t.get('text', '')}")
    return out


def probes(sample: dict, facts_offset: int, half: int = HALF_WINDOW) -> list[Probe]:
    """Probes of one sample; fact indices are offset by ``facts_offset`` (facts of all samples in one list)."""
    facts, turns = _facts(sample), _turns(sample)
    by_session: dict[int, list[str]] = {}
    for dia, (s, pos, line) in sorted(turns.items(), key=lambda kv: kv[1][:2]):
        by_session.setdefault(s, []).append(dia)
    out = []
    for qa in sample["qa"]:
        if qa.get("category") == 5:
            continue
        ev = [e for e in qa.get("evidence", []) if e in turns]
        sessions = sorted({turns[e][0] for e in ev})
        if len(sessions) < 2:
            continue
        last = max(ev, key=lambda e: turns[e][:2])
        s, pos, _ = turns[last]
        window = by_session[s][max(0, pos - half): pos + half + 1]
        earlier = {e for e in ev if turns[e][0] < s}
        pool = [facts_offset + i for i, (_, d) in enumerate(facts) if (_session(d) or 10**6) < s]
        pos_ids = [facts_offset + i for i, (_, d) in enumerate(facts) if d in earlier]
        if pos_ids:
            out.append(Probe("\n".join(turns[d][2] for d in window), pos_ids, pool))
    return out


def sweep(sims: list[np.ndarray], probes_: list[Probe], taus: list[float], k: int = EVOKE_TOP_K) -> list[dict]:
    """Per τ: recall of the facts to evoke, mean evoked, share of probes with nothing evoked, F1.

    ``sims[i]`` holds probe i's cosines to its pool, in ``probes_[i].pool`` order."""
    rows = []
    for tau in taus:
        hit = want = evoked = empty = 0
        for sim, p in zip(sims, probes_):
            order = np.argsort(-sim)[:k]
            chosen = {p.pool[j] for j in order if sim[j] > tau}
            hit += len(chosen & set(p.positives))
            want += len(p.positives)
            evoked += len(chosen)
            empty += not chosen
        recall = hit / want if want else 0.0
        precision = hit / evoked if evoked else 0.0
        f1 = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
        rows.append({"tau": tau, "recall": recall, "precision": precision, "f1": f1,
                     "mean_evoked": evoked / len(probes_), "empty_share": empty / len(probes_)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="locomo10.json (needs the observation annotations)")
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="an embedder name NemoriSettings accepts")
    ap.add_argument("--half", type=int, default=HALF_WINDOW, help="turns either side of the evidence turn")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)

    from benchmarks.machine import describe_machine
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    samples = json.loads(args.data.read_text())
    facts: list[str] = []
    all_probes: list[Probe] = []
    for sample in samples:
        all_probes += probes(sample, len(facts), args.half)
        facts += [t for t, _ in _facts(sample)]
    if not all_probes:
        raise SystemExit(f"{args.data}: no question has evidence in two sessions with observations on the earlier "
                         "turns. Fix: use locomo10.json (its 'observation' annotations cover every session).")
    embedder = resolve_embedder(NemoriSettings(embedder=args.embedder))
    fvec = np.asarray(embedder.embed(facts), dtype=np.float32)
    evec = np.asarray(embedder.embed([p.episode for p in all_probes]), dtype=np.float32)
    sims = [fvec[p.pool] @ evec[i] for i, p in enumerate(all_probes)]
    pos_sims = np.concatenate([fvec[p.positives] @ evec[i] for i, p in enumerate(all_probes)])
    rows = sweep(sims, all_probes, TAUS)
    top = max(r["f1"] for r in rows)
    best = max((r for r in rows if 100 * (top - r["f1"]) <= F1_TIE), key=lambda r: r["tau"])
    print(f"embedder {args.embedder}: {len(all_probes)} probe episodes, {len(facts)} facts, "
          f"{len(pos_sims)} facts to evoke")
    print(f"cosine episode → fact to evoke: p25 {np.percentile(pos_sims, 25):.3f}  median {np.median(pos_sims):.3f}  "
          f"p75 {np.percentile(pos_sims, 75):.3f};  episode → other earlier facts: median "
          f"{np.median(np.concatenate(sims)):.3f}")
    print("| τ | recall of facts to evoke | precision | F1 | mean evoked | nothing evoked |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mark = " ←" if r is best else ""
        print(f"| {r['tau']:.2f}{mark} | {100 * r['recall']:.1f} | {100 * r['precision']:.1f} | {100 * r['f1']:.1f} "
              f"| {r['mean_evoked']:.2f} | {100 * r['empty_share']:.1f}% |")
    print(f"suggested τ for {args.embedder}: {best['tau']:.2f} (highest τ within {F1_TIE} F1 point of the best)")
    result = {"embedder": args.embedder, "probes": len(all_probes), "facts": len(facts), "rows": rows,
              "suggested_tau": best["tau"], "positive_cosine_median": float(np.median(pos_sims)),
              "machine": describe_machine()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"evoke_threshold-{args.embedder.replace('/', '_')}.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
