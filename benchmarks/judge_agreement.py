"""How far the LLM judge can be trusted on a run: its verdicts against hand labels of the same answers.

    python -m benchmarks.judge_agreement --labels benchmarks/labels/judge_hand_labels-conv49-20261204.json
        [--result benchmarks/results/<ablation or eval result>.json] [--out DIR]

The judge audit (``eval/judge_audit.py``) checks the judge on the gold answer and on another question's gold,
pairs a small model passes (the 1.5B: 20 of 20); it does not see the topical, wrong answers a small answer model
writes. Hand labels of a run's own answers do: this prints, per system, the judge's and the hand score, the
judge's agreement, precision (judged CORRECT and hand-labelled correct) and recall, and the paired difference
between the systems by the hand labels and by the judge (bootstrap 95% CI, exact McNemar p), and writes
``benchmarks/results/judge_agreement-<labels>.json``.

A labels file is ``{"result": "<result file name in benchmarks/results>", "labels": [{"sample_id", "index",
"system", "hand": 0 | 1}, ...]}``: ids and labels only, never LoCoMo's text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.results_io import RESULTS_DIR, table as md_table, write_result
from nemori_dspy.errors import ConfigError

__all__ = ["agreement", "main"]


def _key(row: dict[str, Any]) -> tuple[str, Any, str]:
    return row["sample_id"], row["index"], row["system"]


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result.get("figures", {}).get("per_question")
    if rows is None:
        raise ConfigError("the result file has no figures.per_question rows; pass an ablation result file "
                          "(benchmarks/results/ablation-*.json)")
    return rows


def agreement(result: dict[str, Any], labels: list[dict[str, Any]], metric: str = "judge") -> dict[str, Any]:
    """Judge ``metric`` against the hand labels on the labelled rows of ``result``.

    Returns ``{"per_system": {system: {n, hand, judge, agreement, precision, recall}}, "overall": {...},
    "paired": {"hand": stats, metric: stats}}`` (shares in [0, 1]; ``paired`` only with two systems: the second
    minus the first, ``eval.metrics.paired_compare`` fields).

    Raises:
        ConfigError: a label whose row is not in the result (the fields are named), or no labelled row.
    """
    from nemori_dspy.eval.metrics import paired_compare

    by_key = {_key(r): r for r in _rows(result)}
    joined = []
    for lab in labels:
        row = by_key.get(_key(lab))
        if row is None or row.get(metric) is None:
            raise ConfigError(f"label {_key(lab)} has no row with a {metric!r} score in the result file; "
                              "label the answers of the file named in the labels' 'result'")
        joined.append({"system": lab["system"], "key": _key(lab)[:2], "hand": float(lab["hand"]),
                       "judge": float(row[metric])})
    if not joined:
        raise ConfigError("the labels file holds no labels")
    systems = list(dict.fromkeys(j["system"] for j in joined))
    per = {s: _shares([j for j in joined if j["system"] == s]) for s in systems}
    out: dict[str, Any] = {"per_system": per, "overall": _shares(joined), "systems": systems}
    if len(systems) == 2:
        a, b = ({j["key"]: j for j in joined if j["system"] == s} for s in systems)
        common = [k for k in a if k in b]
        out["paired"] = {m: paired_compare([a[k][m] for k in common], [b[k][m] for k in common], binary=True)
                         for m in ("hand", "judge")}
    return out


def _shares(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    judged = [r for r in rows if r["judge"] == 1.0]
    right = [r for r in rows if r["hand"] == 1.0]
    hits = sum(r["judge"] == 1.0 and r["hand"] == 1.0 for r in rows)
    return {"n": n, "hand": sum(r["hand"] for r in rows) / n, "judge": sum(r["judge"] for r in rows) / n,
            "agreement": sum(r["hand"] == r["judge"] for r in rows) / n,
            "precision": hits / len(judged) if judged else None, "recall": hits / len(right) if right else None}


def report(fig: dict[str, Any]) -> str:
    """The agreement table and the paired lines (×100)."""
    from nemori_dspy.eval.metrics import paired_line

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f}"

    rows = [[s, f["n"], pct(f["hand"]), pct(f["judge"]), pct(f["agreement"]), pct(f["precision"]), pct(f["recall"])]
            for s, f in [*fig["per_system"].items(), ("all", fig["overall"])]]
    text = md_table(["system", "n", "hand score", "judge score", "agreement", "judge precision", "judge recall"],
                    rows)
    if "paired" in fig:
        a, b = fig["systems"]
        text += "\n\n" + "\n".join(paired_line(m, s, a, b) for m, s in fig["paired"].items())
    return text


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module docstring); returns 0."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.judge_agreement", description=__doc__.split("\n")[0])
    ap.add_argument("--labels", type=Path, required=True, help="hand labels (benchmarks/labels/*.json)")
    ap.add_argument("--result", type=Path, help="the result file labelled (default: the labels' 'result' in "
                    "benchmarks/results/)")
    ap.add_argument("--out", type=Path, help="where to write the result (default benchmarks/results/)")
    a = ap.parse_args(argv)
    doc = json.loads(a.labels.read_text())
    result_path = a.result or RESULTS_DIR / doc["result"]
    fig = agreement(json.loads(result_path.read_text()), doc["labels"])
    print(report(fig))
    path = write_result(f"judge_agreement-{a.labels.stem}", {"labels": a.labels.name, "result": result_path.name,
                                                              "units": "shares in [0, 1]; printed ×100"},
                        fig, a.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
