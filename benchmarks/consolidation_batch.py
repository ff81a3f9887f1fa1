"""P_con per insight (the paper, §3.3.3) against batched P_con (``consolidation_mode="batched"``) on the labelled cases.

The cases are the optimizers' consolidation cases (``optimizers.datasets.consolidation_cases``: the hand-written
cases and the memory issue's labelled pairs, each an insight with two existing entries, the right action ``new`` |
``merge`` | ``conflict`` and its target), rendered exactly as the pipeline renders a P_con call (``render_fact`` date
prefixes, existing entries dated before the insight).

* ``per_insight``: one ``consolidate`` call per case (``SemanticDistillation._ask_one``'s prompt);
* ``batched``: the cases in consecutive groups of ``--batch`` (seeded shuffle, so a group mixes kinds), one
  ``consolidate_batch`` call per group through ``semantic.batch_decisions`` (what the pipeline runs); a case the
  reply gives no decision for is scored with the per-insight decision, as the pipeline falls back to that call
  (``consolidation.batch_fallback``).

Both are scored with the optimizers' ``consolidate_metric`` (0 for a wrong action; 1 for ``new``; 0.5 + 0.5 ×
Jaccard of the targets for merge/conflict), and "right" = the right action with exactly the right targets. Printed:
per kind and overall, mean score and share right, the paired difference batched − per_insight (paired bootstrap 95%
CI, exact McNemar p on "right"), the LLM calls, tokens and seconds of each. The merge guards of the pipeline
(``merge_refusal``) run after the decision and are not part of it. DSPy's response cache is off unless ``--cache``.
Writes ``benchmarks/results/consolidation_batch-<lm>-<time>.json`` (params, figures, machine).

usage: python -m benchmarks.consolidation_batch [--lm local:0.5b] [--batch 6] [--cache] [--max-cases N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.lm_runtime import lm_overrides, scratch_memory
from benchmarks.results_io import table as md_table, write_result

__all__ = ["DEFAULT_BATCH", "MODES", "against", "score_case", "run", "figures", "report", "main"]

#: insights per batched call: about what one P_dis call writes (the 1.5B writes ~6 facts per call, distill_chunk_messages).
DEFAULT_BATCH = 6
#: the two ways of asking P_con, in the order they run.
MODES = ("per_insight", "batched")


def score_case(case: dict[str, Any], decision: dict[str, Any]) -> tuple[float, bool]:
    """(``consolidate_metric`` score in [0, 1], right action with exactly the right targets) of one decision
    (``{"action", "targets"}``) on one labelled case (``action``, ``targets``)."""
    import dspy

    from nemori_dspy.optimizers.metrics import consolidate_metric
    from nemori_dspy.modules.semantic import target_numbers

    example = dspy.Example(action=case["action"], targets=case["targets"])
    targets = sorted(set(target_numbers(decision.get("targets"))))
    pred = dspy.Prediction(action=str(decision.get("action") or ""), targets=targets)
    score = float(consolidate_metric(example, pred))
    right = pred.action.strip().lower() == case["action"] and (case["action"] == "new" or targets == case["targets"])
    return score, right


def run(lm: str, batch: int, cache: bool = False, max_cases: int | None = None,
        modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """``modes`` (``per_insight`` must come first when both run) on the labelled cases: ``{"cases": [{kind, action, per_insight: {score, right, decision},
    batched: {...}, fallback}], "usage": {mode: stage → calls/tokens/seconds}, "seconds": {mode: s}}``.

    Raises:
        ConfigError / ProviderError: the model cannot be started or reached (``lm_runtime``).
    """
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.formatting import render_entries
    from nemori_dspy.modules.semantic import batch_decisions
    from nemori_dspy.optimizers.datasets import consolidation_cases, dated_case
    from nemori_dspy.usage import UsageLedger

    cases = consolidation_cases()
    random.Random(0).shuffle(cases)
    cases = cases[:max_cases]
    settings = NemoriSettings(**lm_overrides(lm), consolidation_mode="batched", cache=cache, _env_file=None)
    rows: list[dict[str, Any]] = [{"kind": c.get("kind", "hand-written"), "action": c["action"], "targets": c["targets"]}
                                  for c in cases]
    usage: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    with scratch_memory(settings, lm) as memory:
        semantic = memory.pipeline.semantic
        for mode in modes:
            ledger, t0 = UsageLedger(), time.perf_counter()
            with ledger.charging():
                if mode == "per_insight":
                    for row, case in zip(rows, cases):
                        insight, existing = dated_case(case)
                        d = semantic.consolidate(insight=insight, existing_entries=render_entries(existing))
                        row[mode] = {"action": str(d.action), "targets": d.targets}
                else:
                    for i in range(0, len(cases), batch):
                        got = batch_decisions(semantic.consolidate_batch, [dated_case(c) for c in cases[i:i + batch]])
                        for q, row in enumerate(rows[i:i + batch], 1):
                            row["fallback"] = q not in got
                            row[mode] = got.get(q) or row.get("per_insight") or {"action": "", "targets": []}
            usage[mode] = {k: v.model_dump() for k, v in ledger.snapshot().items()}
            seconds[mode] = round(time.perf_counter() - t0, 1)
    for row, case in zip(rows, cases):
        for mode in modes:
            score, right = score_case(case, row[mode])
            row[mode] = {"decision": row[mode], "score": score, "right": right}
    return {"cases": rows, "usage": usage, "seconds": seconds}


def figures(result: dict[str, Any], a: str = "per_insight", b: str = "batched") -> dict[str, Any]:
    """Per kind and ``all``: n, mean score and share right of columns ``a`` and ``b`` of the cases (×100), and the
    paired b − a difference of the score (bootstrap 95% CI) and of "right" (with exact McNemar p)."""
    from nemori_dspy.eval.metrics import paired_compare

    rows = result["cases"]
    out: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in rows}) + ["all"]:
        sel = [r for r in rows if kind in ("all", r["kind"])]
        a_s, b_s = [r[a]["score"] for r in sel], [r[b]["score"] for r in sel]
        a_r, b_r = [float(r[a]["right"]) for r in sel], [float(r[b]["right"]) for r in sel]
        out[kind] = {"n": len(sel), "score": paired_compare(a_s, b_s, binary=False),
                     "right": paired_compare(a_r, b_r, binary=True)}
    out["fallbacks"] = sum(1 for r in rows if r.get("fallback"))
    return out


def against(result: dict[str, Any], earlier: dict[str, Any], mode: str) -> dict[str, Any]:
    """``result``'s cases with column ``before`` = ``mode``'s column of an earlier result file's ``figures.cases``
    (what a change to P_con's prompt or model did on the same cases).

    Raises:
        ConfigError: the earlier file holds other cases (another ``--max-cases`` or changed labelled cases) or not
            ``mode``.
    """
    from nemori_dspy.errors import ConfigError

    old = earlier["figures"]["cases"]
    if [(r["kind"], r["action"], r["targets"]) for r in old] != [
            (r["kind"], r["action"], r["targets"]) for r in result["cases"]] or any(mode not in r for r in old):
        raise ConfigError(f"the --against file holds other cases than this run, or no {mode!r} column. Fix: pass a "
                          "result of the same labelled cases and --max-cases.")
    return {**result, "cases": [{**r, "before": o[mode]} for r, o in zip(result["cases"], old)]}


def _pct(stats: dict[str, Any]) -> str:
    return f"{100 * stats['diff']:+.1f} [{100 * stats['low']:+.1f}, {100 * stats['high']:+.1f}]"


def report(fig: dict[str, Any], result: dict[str, Any], a: str = "per_insight", b: str = "batched") -> str:
    """The Markdown table of ``figures`` (columns ``a`` and ``b``) and the cost of each mode run."""
    body = []
    for kind, f in fig.items():
        if kind == "fallbacks":
            continue
        s, r = f["score"], f["right"]
        body.append([kind, f["n"], f"{100 * s['mean_a']:.1f}", f"{100 * s['mean_b']:.1f}", _pct(s),
                     f"{100 * r['mean_a']:.1f}", f"{100 * r['mean_b']:.1f}", _pct(r),
                     f"{r['wins']}/{r['losses']}", f"{r['mcnemar_p']:.3f}"])
    lines = [md_table(["kind", "n", f"score {a}", f"score {b}", f"{b} − {a}", f"right {a}", f"right {b}",
                       f"right: {b} − {a}", "wins/losses", "McNemar p"], body), ""]
    for mode, stages in result["usage"].items():
        calls = sum(u.get("calls", 0) for u in stages.values())
        tokens = sum(u.get("input_tokens", 0) + u.get("output_tokens", 0) for u in stages.values())
        lines.append(f"{mode}: {calls} LLM calls, {tokens} tokens, {result['seconds'][mode]} s")
    if "batched" in result["usage"]:
        lines.append(f"batched cases without a decision (scored with the per-insight call when it ran, as the "
                     f"pipeline falls back): {fig['fallbacks']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.consolidation_batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--lm", default="local:0.5b", help="scripted | local:<size> | a litellm model string (the memory "
                   "stages run on the default local_memory_model, the 1.5B, with local models)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="insights per batched call")
    p.add_argument("--modes", default=",".join(MODES), help="per_insight,batched (default), or one of them")
    p.add_argument("--against", type=Path, default=None, help="an earlier result file: pair the first mode's "
                   "decisions with that file's (same cases), e.g. before and after a change to P_con's prompt")
    p.add_argument("--cache", action="store_true", help="DSPy's response cache on (a rerun replays the replies)")
    p.add_argument("--max-cases", type=int, default=None, help="only the first N cases (after the seeded shuffle)")
    p.add_argument("--out", type=Path, default=None, help="result folder (default benchmarks/results)")
    args = p.parse_args(argv)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    if not modes or set(args.modes.split(",")) - set(MODES):
        p.error(f"--modes takes per_insight and/or batched, got {args.modes!r}")
    if args.batch < 2:
        p.error("--batch must be >= 2 (one insight is a per-insight call)")
    if args.against is None and len(modes) < 2:
        p.error("one mode needs --against (an earlier result to pair with)")
    result = run(args.lm, args.batch, args.cache, args.max_cases, modes)
    a, b = MODES
    if args.against is not None:
        result = against(result, json.loads(args.against.read_text()), modes[0])
        a, b = "before", modes[0]
    fig = figures(result, a, b)
    print(report(fig, result, a, b))
    name = f"consolidation_batch-{args.lm.replace(':', '_').replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    params = {"lm": args.lm, "batch": args.batch, "modes": list(modes), "cache": args.cache,
              "max_cases": args.max_cases, "against": str(args.against) if args.against else None}
    path = write_result(name, params, {**fig, "cases": result["cases"], "usage": result["usage"],
                                       "seconds": result["seconds"]}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
