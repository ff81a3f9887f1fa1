"""The teacher table: how much of the gap between the small and the larger local model a tuned prompt closes, on
the same held-out narrate examples.

usage: python -m benchmarks.teacher --data locomo10.json --test conv-42,conv-43 [--sessions A-B]
                                    [--program runs/optimize-<time>/program.json] [--optimize-result result.json]
                                    [--reuse-optimize-test] [--rows 0.5b,0.5b-tuned,1.5b] [--max-examples N]
                                    [--against earlier-result.json] [--cache] [--out DIR]

Rows (P_nar on every labelled LoCoMo session of the ``--test`` conversations, rendered as the pipeline renders an
episode: ``optimizers.datasets.narrate_session_examples``):

* ``0.5b``: the 0.5B model writes the narratives with the default prompt (``local_memory_model=0.5b``);
* ``0.5b-tuned``: the same with ``--program`` applied (e.g. ``optimize --stage narrate --examples sessions`` with
  the 1.5B as ``--reflection-model``, the teacher);
* ``1.5b``: the 1.5B model with the default prompt (``local_memory_model=1.5b``, the shipped default);
* ``0.5b-zero-shot`` / ``1.5b-zero-shot``: the same model without the seed demo (``seed_demos=False``: P_nar's
  instruction alone, as the paper's Appendix D prompts are), paired also against the ``1.5b`` row.

``--sessions A-B`` keeps sessions A-B of each test conversation (as ``optimize --sessions`` does). With
``--reuse-optimize-test`` the ``0.5b`` and ``0.5b-tuned`` rows are the optimize run's own test scores before and after
tuning (``--optimize-result``'s ``test_before`` / ``test_after``, per example), so only the ``1.5b`` row runs; pass
the optimize run's ``--test`` and ``--sessions`` so the examples are the same (the counts must match).

Each row is scored with the narrate stage metric of ``optimize`` (``ObservationMetric``: coverage of the session's
gold observations and faithfulness to its messages, minus a length penalty; echo or copy = 0), with the mean, 95%
CI and n, the paired difference against ``0.5b`` (paired bootstrap 95% CI), the LLM calls, tokens and minutes it
took, and, from ``--optimize-result``, what the tuning cost. ``gap closed`` = (tuned − 0.5b) / (1.5b − 0.5b).
``--against`` pairs each row with the row of the same name in an earlier result file (what a code change did to it;
the replies must be the same model's on the same examples). DSPy's response cache is off unless ``--cache``, so the
cost is real. Writes ``<out>/teacher-narrate-<time>.json``
(``benchmarks.results_io.write_result``: params, figures and the machine).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.lm_runtime import scratch_memory
from benchmarks.results_io import RESULTS_DIR, cli_description, table as md_table, write_result
from nemori_dspy.errors import ConfigError

__all__ = ["Row", "ROWS", "row_settings", "score_row", "optimize_rows", "figures", "report", "main"]

class Row(NamedTuple):
    """One row of the table: the local model that writes memory, whether ``--program`` is applied, whether P_nar
    is shown its seed demo."""

    size: str
    tuned: bool
    seed_demo: bool


ROWS: dict[str, Row] = {
    "0.5b": Row("0.5b", False, True), "0.5b-tuned": Row("0.5b", True, True), "1.5b": Row("1.5b", False, True),
    "0.5b-zero-shot": Row("0.5b", False, False), "1.5b-zero-shot": Row("1.5b", False, False)}
#: rows every row is paired against when both ran on the same examples.
BASELINE, SHIPPED = "0.5b", "1.5b"
#: the rows run when ``--rows`` is not given.
DEFAULT_ROWS = ("0.5b", "0.5b-tuned", "1.5b")
#: rows ``--reuse-optimize-test`` takes from the optimize run's test scores (before, after tuning).
FROM_OPTIMIZE = {"0.5b": "test_before", "0.5b-tuned": "test_after"}


def row_settings(row: str, lm: str, cache: bool = False) -> dict[str, Any]:
    """The settings overrides of one row: ``lm`` ``local`` runs the embedded models (``local_memory_model`` = the
    row's size); ``scripted`` (tests) runs the scripted LM with the hashing embedder. ``cache`` turns DSPy's response
    cache on (``--cache``: a rerun replays the replies, so a change after the LM call is measured in seconds).

    Raises:
        ConfigError: unknown row (the message lists them).
    """
    if row not in ROWS:
        raise ConfigError(f"unknown row {row!r}. Fix: use some of {', '.join(ROWS)}.")
    demos = {} if ROWS[row].seed_demo else {"seed_demos": False}
    if lm == "scripted":
        return {"embedder": "hashing-64", "cache": cache, **demos}
    return {"model": "local", "local_model_size": "0.5b", "local_memory_model": ROWS[row].size, "cache": cache, **demos}


def score_row(row: str, lm: str, conversations: list[Any], program: dict[str, Any] | None,
              max_examples: int | None = None, cache: bool = False) -> dict[str, Any]:
    """One row: ``{"row", "scores" (per example, in [0, 1]), "n", "mean", "low", "high", "usage" (stage → calls,
    tokens, seconds), "minutes"}``.

    Raises:
        ConfigError: ``0.5b-tuned`` without a program, or no labelled session in ``conversations``.
    """
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.optimizers.datasets import narrate_session_examples
    from nemori_dspy.optimizers.optimize import score_program
    from nemori_dspy.optimizers.tune import stage_metric, stage_program
    from nemori_dspy.usage import UsageLedger

    tuned = ROWS[row].tuned if row in ROWS else False
    if tuned and program is None:
        raise ConfigError(f"row {row!r} needs the tuned program. Fix: pass --program runs/optimize-<time>/program.json.")
    settings = NemoriSettings(**row_settings(row, lm, cache), _env_file=None)
    examples = narrate_session_examples(conversations, settings)[:max_examples]
    if not examples:
        raise ConfigError("no labelled session in the test conversations. Fix: pick LoCoMo conversations.")
    t0 = time.perf_counter()
    ledger = UsageLedger()
    with ledger.charging(), scratch_memory(settings, lm, program if tuned else None) as memory:
        score = score_program(stage_program("narrate", memory.pipeline), examples,
                              stage_metric("narrate", None, memory.embedder))
    usage = {k: v.model_dump() for k, v in ledger.snapshot().items()}
    return {"row": row, **score.model_dump(exclude={"parts"}), "usage": usage,
            "minutes": round((time.perf_counter() - t0) / 60, 2)}


def optimize_rows(path: Path, n: int) -> list[dict[str, Any]]:
    """Rows ``0.5b`` and ``0.5b-tuned`` from an optimize run's ``result.json``: its narrate stage's test scores
    before and after tuning (per example, in [0, 1]), usage and minutes marked as spent inside that run.

    Raises:
        ConfigError: no narrate stage or no test scores in the file, or ``n`` (this run's examples) differs from
            the optimize run's test count (other conversations or sessions).
    """
    narrate = [r for r in json.loads(path.read_text()) if r.get("stage") == "narrate"]
    if not narrate or not narrate[0].get("test_before") or not narrate[0].get("test_after"):
        raise ConfigError(f"{path}: no narrate test scores. Fix: pass the result.json of an optimize --stage narrate "
                          "run with --test, or drop --reuse-optimize-test.")
    rows = []
    for row, key in FROM_OPTIMIZE.items():
        score = narrate[0][key]
        if score["n"] != n:
            raise ConfigError(f"{path}: the optimize run scored {score['n']} test examples, this run has {n}. Fix: "
                              "pass the optimize run's --test and --sessions (and no --max-examples).")
        rows.append({"row": row, **{k: score[k] for k in ("mean", "low", "high", "n", "scores")}, "usage": {},
                     "minutes": 0.0, "from": f"{path} ({key})"})
    return rows


def figures(rows: list[dict[str, Any]], optimize_cost: dict[str, Any] | None = None,
            earlier: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rows with their paired difference (paired bootstrap 95% CI, ``paired_vs_0.5b`` and ``paired_vs_1.5b``)
    against ``0.5b`` and against ``1.5b`` (None unless both ran on the same examples), and the share of the
    0.5B → 1.5B gap the tuned prompt closes (None when a row is missing or the gap is 0). With ``earlier`` (the
    rows of an earlier result file, ``--against``) each row also gets ``paired_vs_earlier``: the difference from
    the earlier file's row of the same name on the same examples (None if it has none, or another n): what a code
    change did to that row."""
    from nemori_dspy.eval.metrics import paired_compare

    by = {r["row"]: r for r in rows}
    for name in (BASELINE, SHIPPED):
        base = by.get(name)
        for r in rows:
            same = base is not None and r is not base and len(r["scores"]) == len(base["scores"])
            r[f"paired_vs_{name}"] = paired_compare(base["scores"], r["scores"], binary=False) if same else None
    old = {r["row"]: r for r in earlier or []}
    for r in rows:
        prev = old.get(r["row"])
        same = prev is not None and len(prev["scores"]) == len(r["scores"])
        r["paired_vs_earlier"] = (paired_compare(prev["scores"], r["scores"], binary=False) | {"earlier_mean": prev["mean"]}
                                  if same else None)
    gap = None
    if {"0.5b", "0.5b-tuned", "1.5b"} <= set(by) and by["1.5b"]["mean"] != by["0.5b"]["mean"]:
        gap = (by["0.5b-tuned"]["mean"] - by["0.5b"]["mean"]) / (by["1.5b"]["mean"] - by["0.5b"]["mean"])
    return {"rows": rows, "gap_closed": gap, "optimize_cost": optimize_cost}


def _diff(p: dict[str, Any] | None) -> str:
    return f"{100 * p['diff']:+.1f} [{100 * p['low']:+.1f}, {100 * p['high']:+.1f}]" if p else "–"


def _calls(usage: dict[str, Any]) -> str:
    calls = sum(u.get("calls", 0) for u in usage.values())
    tokens = sum(u.get("input_tokens", 0) + u.get("output_tokens", 0) for u in usage.values())
    return f"{calls} calls, {tokens:,} tokens"


def report(fig: dict[str, Any]) -> str:
    """The teacher table as Markdown (scores ×100)."""
    lines = []
    for r in fig["rows"]:
        lines.append([r["row"], f"{100 * r['mean']:.1f} [{100 * r['low']:.1f}–{100 * r['high']:.1f}]", r["n"],
                      _diff(r.get(f"paired_vs_{BASELINE}")), _diff(r.get(f"paired_vs_{SHIPPED}")),
                      "optimize run's test" if r.get("from") else _calls(r["usage"]),
                      "–" if r.get("from") else f"{r['minutes']:.1f}"])
    out = md_table(["row", "narrate metric [95% CI]", "n", f"− {BASELINE}, paired [95% CI]",
                    f"− {SHIPPED}, paired [95% CI]", "cost", "min"], lines)
    for r in fig["rows"]:
        if r.get("paired_vs_earlier"):
            p = r["paired_vs_earlier"]
            out += (f"\n\n{r['row']} vs the same row of the --against file: {100 * p['earlier_mean']:.1f} → "
                    f"{100 * r['mean']:.1f}, paired {_diff(p)} (n = {r['n']})")
    if fig.get("gap_closed") is not None:
        out += f"\n\ngap closed by tuning: {100 * fig['gap_closed']:.0f}% of the 0.5B → 1.5B difference"
    if fig.get("optimize_cost"):
        c = fig["optimize_cost"]
        out += (f"\n\ntuning cost (from the optimize run): {_calls(c.get('cost', {}))}, "
                f"{c.get('seconds', 0) / 60:.1f} min")
    return out


def _optimize_cost(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    narrate = [r for r in json.loads(path.read_text()) if r.get("stage") == "narrate"]
    if not narrate:
        raise ConfigError(f"{path}: no narrate stage in this optimize result. Fix: pass the narrate run's result.json.")
    return {"cost": narrate[0].get("cost", {}), "seconds": narrate[0].get("seconds", 0)}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.teacher``: score the rows, print the table, write the result file; returns 0.

    Raises:
        ConfigError: unknown row, missing program; DatasetError: bad data or conversation ids.
    """
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions
    from nemori_dspy.eval.model import load_program
    from nemori_dspy.optimizers.datasets import narrate_session_examples

    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", type=Path, required=True, help="locomo10.json or a file in its schema")
    ap.add_argument("--test", required=True, help="comma-separated held-out conversation ids (never tuned on)")
    ap.add_argument("--program", type=Path, default=None, help="the tuned program.json (row 0.5b-tuned)")
    ap.add_argument("--optimize-result", type=Path, default=None, help="that run's result.json (its tuning cost)")
    ap.add_argument("--rows", default=None, help=f"comma-separated, from {', '.join(ROWS)} (default: "
                                                 f"{','.join(DEFAULT_ROWS)}; without --program the tuned row is "
                                                 "left out)")
    ap.add_argument("--lm", default="local", choices=["local", "scripted"], help="'scripted': no model (tests)")
    ap.add_argument("--sessions", default=None, help="sessions A-B of each test conversation (default: all), as "
                                                     "optimize --sessions")
    ap.add_argument("--reuse-optimize-test", action="store_true",
                    help="rows 0.5b and 0.5b-tuned from --optimize-result's test scores; only the others run")
    ap.add_argument("--max-examples", type=int, default=None, help="score only the first N sessions")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the result file goes")
    ap.add_argument("--against", type=Path, default=None,
                    help="an earlier teacher result file: pair each row with its row of the same name there")
    ap.add_argument("--cache", action="store_true",
                    help="DSPy's response cache on: a rerun replays the replies (cost columns then count cache hits)")
    a = ap.parse_args(argv)
    if a.reuse_optimize_test and a.optimize_result is None:
        raise ConfigError("--reuse-optimize-test reads the optimize run's test scores. Fix: pass --optimize-result "
                          "runs/optimize-<time>/result.json.")
    rows = (a.rows.split(",") if a.rows
            else [r for r in DEFAULT_ROWS if a.program or a.reuse_optimize_test or not ROWS[r].tuned])
    reused = [r for r in rows if r in FROM_OPTIMIZE] if a.reuse_optimize_test else []
    for r in rows:
        row_settings(r, a.lm)  # unknown rows fail before any model loads
        if ROWS[r].tuned and a.program is None and r not in reused:
            raise ConfigError(f"row {r!r} needs the tuned program. Fix: pass --program "
                              "runs/optimize-<time>/program.json.")
    program = load_program(str(a.program)) if a.program else None
    convs = load_locomo(a.data, [c.strip() for c in a.test.split(",") if c.strip()])
    if a.sessions:
        convs = [slice_sessions(c, parse_sessions(a.sessions)) for c in convs]
    scored = [score_row(r, a.lm, convs, program, a.max_examples, a.cache) for r in rows if r not in reused]
    if reused:
        n = scored[0]["n"] if scored else len(narrate_session_examples(convs, NemoriSettings(_env_file=None)))
        scored = [*[x for x in optimize_rows(a.optimize_result, n) if x["row"] in reused], *scored]
    earlier = json.loads(a.against.read_text())["figures"]["rows"] if a.against else None
    fig = figures(scored, _optimize_cost(a.optimize_result), earlier)
    print(report(fig))
    params = {"data": str(a.data), "test": a.test, "program": str(a.program) if a.program else None, "rows": rows,
              "lm": a.lm, "max_examples": a.max_examples, "stage": "narrate", "examples": "sessions",
              "sessions": a.sessions, "rows_from_optimize": reused, "cache": a.cache,
              "against": str(a.against) if a.against else None,
              "units": "scores in [0, 1]; printed ×100"}
    path = write_result(f"teacher-narrate-{time.strftime('%Y%m%d-%H%M%S')}", params, {**fig, "report": report(fig)},
                        a.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
