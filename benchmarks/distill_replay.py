"""P_dis replayed: the current P_dis prompt against the replies a built memory recorded, on the same inputs, scored
against LoCoMo's gold observations of each run's messages.

A memory built by ``eval locomo`` records every stage call in ``<store>.stages.jsonl`` (``nemori_dspy.recording``).
This benchmark sends each recorded P_dis input (one run of at most ``distill_chunk_messages`` messages and P_ant's
prediction) through today's P_dis (signature, instruction, demos; the model of ``--lm``, the 1.5B writer by
default) and cleans both replies with today's insight rules (``modules.semantic.clean_insights``). Per gold
observation of a run's messages: is it matched by a kept insight (``eval.memory_quality.FactMatcher``), recorded
reply (A) vs new reply (B), paired (bootstrap 95% CI, exact McNemar); and the share of kept insights the run's
messages support (``SupportChecker``). Consolidation is not run: this scores the stage, not the memory.

Usage::

    python -m benchmarks.distill_replay --data ../shared/data/locomo/locomo10.json \\
        --stages <store>.stages.jsonl[,<other>.stages.jsonl] [--lm local:1.5b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path
from typing import Any, Iterable, Iterator

from benchmarks.lm_runtime import lm_overrides, scratch_memory
from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.errors import ConfigError

__all__ = ["recorded_runs", "replay", "score", "main"]


def recorded_runs(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """The P_dis calls of stage-record files, in order: ``{"file", "row", "user", "ids", "messages", "predicted",
    "recorded"}`` (``recorded``: the insights the call returned then).

    Raises:
        ConfigError: a file is missing or holds no P_dis call.
    """
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"--stages: {path} not found. Fix: pass the <store>.stages.jsonl an eval run printed "
                              "beside its memory store.")
        found = 0
        for i, line in enumerate(path.read_text().splitlines()):
            rec = json.loads(line)
            if rec.get("stage") != "distill":
                continue
            found += 1
            yield {"file": str(path), "row": i, "user": rec["meta"]["user_id"], "ids": rec["meta"]["message_ids"],
                   "messages": rec["inputs"]["episode_messages"], "predicted": rec["inputs"]["predicted_episode"],
                   "recorded": list(rec["outputs"].get("insights") or [])}
        if not found:
            raise ConfigError(f"--stages: {path} holds no P_dis call. Fix: pass the stage records of a memory built "
                              "with distillation='prediction_error'.")


def replay(runs: list[dict[str, Any]], settings: Any, lm: str) -> list[dict[str, Any]]:
    """Each run with ``"replayed"``: the insights today's P_dis returns on its recorded inputs (``lm``'s model)."""
    from nemori_dspy.modules.pipeline import pipeline_stage

    out = []
    with scratch_memory(settings, lm) as memory:
        stage = pipeline_stage(memory.pipeline, "distill")
        for run in runs:
            pred = stage(episode_messages=run["messages"], predicted_episode=run["predicted"])
            out.append({**run, "replayed": list(pred.insights or [])})
    return out


def score(runs: list[dict[str, Any]], conversations: dict[str, Any], embedder: Any) -> dict[str, Any]:
    """Paired gold-observation recall (recorded → replayed) and support of the kept insights, both cleaned by
    today's rules. Returns ``{"recall": paired_compare(...) ×1, "support_recorded", "support_replayed" (shares),
    "kept_recorded", "kept_replayed", "supported_recorded", "supported_replayed", "runs", "gold"}``."""
    from nemori_dspy.eval.memory_quality import FactMatcher, SupportChecker, gold_observations
    from nemori_dspy.eval.metrics import paired_compare
    from nemori_dspy.insight_rules import dated_message_lines
    from nemori_dspy.modules.semantic import clean_insights

    matcher, checker = FactMatcher(embedder), SupportChecker(embedder)
    hit: dict[str, list[float]] = {"recorded": [], "replayed": []}
    sup: dict[str, list[bool]] = {"recorded": [], "replayed": []}
    for run in runs:
        golds = [g.text for g in gold_observations(conversations[run["user"]]) if set(g.dia_ids) & set(run["ids"])]
        lines = [(who, f"{date.fromisoformat(day):%B %Y}" if day else "", text)  # SupportLine: speaker, month, text
                 for who, text, day in dated_message_lines(run["messages"])]
        for side in hit:
            kept = clean_insights(run[side], run["messages"], predicted=run["predicted"])
            if golds:
                m = matcher.match_matrix(golds, kept) if kept else None
                hit[side] += [float(m is not None and m[i].any()) for i in range(len(golds))]
            sup[side] += checker.supported(kept, lines)
    share = {side: (sum(v) / len(v) if v else 0.0) for side, v in sup.items()}
    return {"recall": paired_compare(hit["recorded"], hit["replayed"], binary=True), "runs": len(runs),
            "gold": len(hit["recorded"]), **{f"kept_{s}": len(v) for s, v in sup.items()},
            **{f"supported_{s}": sum(v) for s, v in sup.items()}, **{f"support_{s}": share[s] for s in share}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: replay, score, print the table, write ``benchmarks/results/distill_replay-<lm>-<time>.json``."""
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder
    from nemori_dspy.eval.locomo import load_locomo

    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", required=True, help="the LoCoMo JSON the memories were built from")
    ap.add_argument("--stages", required=True, help="comma-separated <store>.stages.jsonl files")
    ap.add_argument("--lm", default="local:1.5b", help="model of the replay: local:<size>, a litellm string, or "
                                                      "'scripted' (tests)")
    ap.add_argument("--embedder", default=None, help="matcher embedder (default: the settings' MiniLM; 'hashing' "
                                                      "in tests)")
    ap.add_argument("--out", default=None, help="result folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    runs = list(recorded_runs(Path(p) for p in args.stages.split(",")))
    conversations = {c.sample_id: c for c in load_locomo(Path(args.data))}
    missing = sorted({r["user"] for r in runs} - set(conversations))
    if missing:
        raise ConfigError(f"--data holds no conversation {missing}. Fix: pass the LoCoMo file the memory was built "
                          "from.")
    settings = NemoriSettings(**lm_overrides(args.lm), **({"local_memory_model": args.lm.split(":", 1)[1]}
                                                         if args.lm.startswith("local:") else {}),
                              **({"embedder": args.embedder} if args.embedder else {}), _env_file=None)
    t0 = time.perf_counter()
    replayed = replay(runs, settings, args.lm)
    minutes = round((time.perf_counter() - t0) / 60, 1)
    figures = {**score(replayed, conversations, resolve_embedder(settings)), "minutes": minutes}
    r = figures["recall"]
    print(table(["P_dis calls", "gold obs.", "recall recorded", "recall replayed", "replayed − recorded, paired",
                 "wins / losses (McNemar p)", "kept (supported) recorded", "kept (supported) replayed", "minutes"],
                [[figures["runs"], figures["gold"], f"{100 * r['mean_a']:.1f}", f"{100 * r['mean_b']:.1f}",
                  f"{100 * r['diff']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]",
                  f"{r['wins']} / {r['losses']} ({r['mcnemar_p']:.3f})",
                  f"{figures['kept_recorded']} ({figures['supported_recorded']})",
                  f"{figures['kept_replayed']} ({figures['supported_replayed']})", minutes]]))
    label = args.lm.replace(":", "_").replace("/", "_")
    path = write_result(f"distill_replay-{label}-{time.strftime('%Y%m%d-%H%M%S')}",
                        {"data": args.data, "stages": args.stages, "lm": args.lm},
                        {**figures, "runs_detail": [{k: run[k] for k in ("file", "row", "user", "recorded", "replayed")}
                                                    for run in replayed]},
                        Path(args.out) if args.out else None)
    print(f"result: {path}")
    return figures


if __name__ == "__main__":  # pragma: no cover
    main()
