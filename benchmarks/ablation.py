"""The paper's ablation (Table 5) on one LoCoMo slice from one command, every system paired with ``nemori``.

usage: python -m benchmarks.ablation --lm local:0.5b --data locomo10.json
                                     [--slice NAME | --conversations conv-26,conv-30 --sessions 1-3]
                                     [--judge-model local:1.5b] [--max-questions N] [--systems a,b,...]
                                     [--run-dir runs/ablation-<time>] [--resume] [--fresh-memory] [--out DIR]

Systems (``eval.systems``; default: those of the list below that exist): ``nemori`` (the default, the
baseline every other system is paired with), ``nemori-paper`` (the paper's configuration), ``nemori-s``
(direct distillation, semantic only), ``nemori-no-consolidation`` (management ✗), ``nemori-no-episodic``
(w/o e), ``nemori-no-semantic`` (w/o s), ``nemori-no-raw`` (w/o p), ``full-context``, ``rag-4096``,
``no-memory`` (w/o Nemori).

It reuses the eval machinery as it is: the runtime (``nemori_dspy.runtime.build_runtime``), the memory
provider of ``eval locomo`` (``nemori_dspy.apps.context.memory_provider``: stores reused by construction key, so a
slice built once serves every answer-side variant and later runs) and ``eval.runner.run_locomo``. Systems
that read the same built memory (``System.construction_key``) run together in one ``run_locomo`` call, one
run folder per construction, so each construction's cost is its own. Questions are the same for every system
(``--max-questions`` per conversation, stratified by category).

Per system it reports the answer scores (judge, F1, BLEU-1, evidence recall@10: mean with 95% CI), the
paired difference against ``nemori`` on the questions both answered (paired bootstrap 95% CI; for the judge
wins/losses and the exact McNemar p: ``eval.metrics.paired_stats``), the construction cost of the memory it
reads (LLM calls and tokens per 100 turns, per stage; ``None`` when the memory was reused from an earlier run:
pass ``--fresh-memory`` to measure it), and the run summary's memory-quality (``RunSummary.memory``) and
stage-activity (``RunSummary.stage_activity``) sections when the eval provides them. Two findings lines
compare prediction-error distillation with direct distillation: the paper's like-for-like pair (w/o e vs
Nemori-s: both answer from semantic memory only) and ``nemori`` vs ``nemori-s``.

Writes ``<out>/ablation-<lm>-<slice>-<time>.json`` (``benchmarks.results_io.write_result``: params, figures
and the machine) after every construction, so a long run stopped early keeps what it measured. A slice too long to
build every construction in one sitting runs a group at a time (``--systems``) and ``--merge a.json b.json`` pairs
the files' systems again (``merge_results``).
"""

from __future__ import annotations

import argparse
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.lm_runtime import SCRIPTED, lm_overrides, lm_runtime
from benchmarks.results_io import RESULTS_DIR, cli_description, table as md_table, write_result
from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.locomo import LoCoMoConversation, dataset_sha256, load_locomo, parse_sessions, slice_sessions
from nemori_dspy.eval.metrics import category_scores, format_p, paired_compare, paired_scores, paired_stats
from nemori_dspy.eval.metrics import paired_table_from_stats
from nemori_dspy.eval.runner import CONSTRUCTION_STAGES, EvalOptions, run_locomo
from nemori_dspy.eval.summary import RunResult
from nemori_dspy.eval.systems import SYSTEMS, System, parse_systems

__all__ = ["TABLE5", "DEFAULT_SYSTEMS", "BASELINE", "METRICS", "default_systems", "resolve_slice",
           "construction_groups", "construction_cost", "figures", "merge_results", "MERGE_KEYS", "distillation_findings",
           "report", "run", "main"]

#: Table 5's rows, in the paper's order: (system, the paper's name for it, native management ✓ / ✗ / –).
TABLE5: list[tuple[str, str, str]] = [
    ("no-memory", "w/o Nemori", "–"),
    ("nemori-s", "Nemori-s", "✓"),
    ("nemori-no-episodic", "w/o e", "✓"),
    ("nemori-no-semantic", "w/o s", "✓"),
    ("nemori-no-raw", "w/o p", "✓"),
    ("nemori-no-consolidation", "Nemori, management ✗", "✗"),
    ("nemori", "Nemori (default)", "✓"),
    ("nemori-paper", "Nemori (paper configuration)", "✓"),
    ("full-context", "Full Context", "–"),
    ("rag-4096", "RAG-4096", "–"),
]
_LABELS = {name: (label, mgmt) for name, label, mgmt in TABLE5}

#: the systems run by default, baseline first (``nemori-paper`` is run once ``eval.systems`` defines it).
DEFAULT_SYSTEMS = ["nemori", "nemori-paper", "nemori-s", "nemori-no-consolidation", "nemori-no-episodic",
                   "nemori-no-semantic", "nemori-no-raw", "full-context", "rag-4096", "no-memory"]
BASELINE = "nemori"
#: answer scores reported and paired (``judge`` only when judged; recall only for systems that retrieve).
METRICS = ["judge", "f1", "bleu1", "recall_at_10"]


def default_systems() -> list[str]:
    """:data:`DEFAULT_SYSTEMS` that ``eval.systems.SYSTEMS`` defines, in that order."""
    return [name for name in DEFAULT_SYSTEMS if name in SYSTEMS]


def resolve_slice(name: str) -> tuple[list[str] | None, str | None]:
    """``--slice NAME`` → (conversation ids, sessions ``"A-B"`` or None for all), from ``eval.locomo.NAMED_SLICES``
    (the same names ``eval locomo --slice`` takes).

    Raises:
        ConfigError: no such named slice (the message lists the known ones).
    """
    from nemori_dspy.errors import DatasetError
    from nemori_dspy.eval.locomo import named_slice

    try:
        ids, sessions = named_slice(name)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from exc
    return (list(ids) or None), (sessions.label() if sessions is not None else None)


def construction_groups(systems: list[System]) -> list[list[System]]:
    """Systems grouped by the memory they read (``System.construction_key`` of those that build Nemori memory),
    in order of first appearance; systems that build none (full context, RAG, no memory) join the first group.
    Each group is one ``run_locomo`` call, so each construction is charged its own cost."""
    groups: dict[str, list[System]] = {}
    loose: list[System] = []
    for s in systems:
        if s.builds == "nemori":
            groups.setdefault(s.construction_key(), []).append(s)
        else:
            loose.append(s)
    ordered = list(groups.values()) or [[]]
    ordered[0] = ordered[0] + loose
    return ordered


def construction_cost(construction_usage: dict[str, Any], turns: int, reused: bool) -> dict[str, Any]:
    """LLM calls and tokens (input + output) per 100 turns, in all and per construction stage.

    Args:
        construction_usage: ``RunSummary.construction_usage`` (``{stage: Usage.model_dump()}``).
        turns: turns built (all conversations of the slice).
        reused: the memory came from an earlier run (its cost is not in this run's figures).

    Returns:
        ``{"reused", "turns", "calls_per_100", "tokens_per_100", "per_stage": {stage: {"calls", "tokens"}}}``;
        the figures are None when ``reused``.
    """
    if reused:
        return {"reused": True, "turns": turns, "calls_per_100": None, "tokens_per_100": None, "per_stage": {}}
    scale = 100 / max(turns, 1)
    per = {s: {"calls": u.get("calls", 0) * scale,
               "tokens": (u.get("input_tokens", 0) + u.get("output_tokens", 0)) * scale}
           for s, u in construction_usage.items() if s in CONSTRUCTION_STAGES and u.get("calls", 0)}
    return {"reused": False, "turns": turns, "calls_per_100": sum(p["calls"] for p in per.values()),
            "tokens_per_100": sum(p["tokens"] for p in per.values()), "per_stage": per}


def _reused(summary: RunResult) -> bool:
    """Memory of this construction was reused and nothing was built now."""
    return bool(summary.reused_memory) and not summary.ingest_seconds


@dataclass
class GroupRun:
    """One construction's ``run_locomo``: its systems, run folder and summary."""

    systems: list[str]
    run_dir: Path
    summary: RunResult


def _system_scores(rows: list[dict], system: str, metrics: list[str]) -> dict[str, dict[str, list[float]]]:
    """``{metric: {category | "overall": [mean, low, high, n]}}`` (scores in [0, 1]) for one system."""
    out: dict[str, dict[str, list[float]]] = {}
    for m in metrics:
        cells = category_scores(rows, m, [system]).get(system, {})
        if any(n for *_, n in cells.values()):
            out[m] = {cat: [*v[:3], v[3]] for cat, v in cells.items()}
    return out


def figures(groups: list[GroupRun], turns: int, metrics: list[str] | None = None, n_resamples: int = 10_000,
            seed: int = 0) -> dict[str, Any]:
    """Everything the result file holds, from the groups' summaries (scores and differences in [0, 1]).

    Returns:
        ``{"systems": [...], "baseline", "per_system": {system: {"label", "management", "run_dir", "scores",
        "construction", "memory", "stage_activity", "context_tokens"}}, "paired": paired_stats(...),
        "findings": distillation_findings(...), "questions": distinct questions, "per_question": [{system,
        sample_id, index, category, <metric>...}]}`` (the rows, so any pairing can be redone from the file).
    """
    metrics = metrics or METRICS
    rows = [r for g in groups for r in g.summary.rows]
    per: dict[str, Any] = {}
    for g in groups:
        cost = construction_cost(g.summary.construction_usage, turns, _reused(g.summary))
        cost["reused_conversations"] = list(g.summary.reused_memory)  # partly reused: figures cover the rest
        for name in g.systems:
            builds = SYSTEMS[name].builds == "nemori" if name in SYSTEMS else False
            label, mgmt = _LABELS.get(name, (name, "–"))
            tokens = [float(r["context_tokens"]) for r in rows if r.get("system") == name
                      and r.get("context_tokens") is not None]
            per[name] = {"label": label, "management": mgmt, "run_dir": str(g.run_dir),
                         "scores": _system_scores(rows, name, metrics),
                         "construction": cost if builds else None,
                         "memory": g.summary.memory if builds else None,
                         "stage_activity": g.summary.stage_activity if builds else None,
                         "context_tokens": sum(tokens) / len(tokens) if tokens else None}
    keep = ("system", "sample_id", "index", "category", *metrics)
    return _paired_figures(per, [{k: r[k] for k in keep if k in r} for r in rows], metrics, n_resamples, seed)


def _paired_figures(per: dict[str, Any], rows: list[dict], metrics: list[str], n_resamples: int, seed: int
                    ) -> dict[str, Any]:
    """The result file's figures from per-system sections and per-question rows: systems in Table 5 order, the
    baseline, paired differences and the distillation findings."""
    rank = {n: i for i, (n, *_) in enumerate(TABLE5)}
    systems = sorted(per, key=lambda n: rank.get(n, len(rank)))
    baseline = BASELINE if BASELINE in systems else systems[0]
    paired = paired_stats(rows, systems, baseline, metrics, n_resamples=n_resamples, seed=seed)
    return {"systems": systems, "baseline": baseline, "per_system": per, "paired": paired,
            "findings": distillation_findings(rows, n_resamples=n_resamples, seed=seed),
            "questions": len({(r.get("sample_id"), r.get("index")) for r in rows}), "per_question": rows}


#: params two result files must share to be merged (the same data, slice, models and judge)
MERGE_KEYS = ("data_sha256", "conversations", "sessions", "lm", "judge_model", "judge")


def merge_results(paths: list[Path], metrics: list[str] | None = None, n_resamples: int = 10_000, seed: int = 0
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, figures)`` of several ablation result files run one construction group at a time (e.g. one per
    session: ``--systems nemori,no-memory,...`` then ``--systems nemori-s,...``), with every system paired again
    with ``nemori`` on the questions both answered (``per_question`` rows of each file). Files with different
    ``--max-questions`` pair on the questions they share (stratified sampling deals the same questions first).

    Raises:
        ConfigError: fewer than two files; a file that is no ablation result; files that differ in a
            ``MERGE_KEYS`` param (data, slice, model or judge: the field is named); a system in two files.
    """
    import json

    if len(paths) < 2:
        raise ConfigError("--merge takes two or more ablation result files (benchmarks/results/ablation-*.json)")
    loaded = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        if "per_system" not in doc.get("figures", {}) or "per_question" not in doc["figures"]:
            raise ConfigError(f"{path} is no ablation result file (no figures.per_system / per_question); "
                              "pass files written by python -m benchmarks.ablation")
        loaded.append((Path(path), doc))
    first_path, first = loaded[0]
    per: dict[str, Any] = {}
    rows: list[dict] = []
    for path, doc in loaded:
        for key in MERGE_KEYS:
            if doc["params"].get(key) != first["params"].get(key):
                raise ConfigError(f"{path} and {first_path} differ in params.{key} ({doc['params'].get(key)!r} vs "
                                  f"{first['params'].get(key)!r}); merge only runs of the same data, slice and models")
        for name, section in doc["figures"]["per_system"].items():
            if name in per:
                raise ConfigError(f"system {name!r} is in more than one file ({path}); run each system once or "
                                  "leave one file out")
            per[name] = section
        rows += doc["figures"]["per_question"]
    params = {**{k: first["params"].get(k) for k in (*MERGE_KEYS, "data", "slice")},
              "systems": list(per), "merged_from": [p.name for p, _ in loaded],
              "max_questions": sorted({d["params"].get("max_questions") for _, d in loaded}, key=str),
              "complete": all(d["params"].get("complete") for _, d in loaded),
              "seconds": round(sum(d["params"].get("seconds") or 0 for _, d in loaded), 1),
              "turns": first["params"].get("turns"),
              "units": "scores and differences in [0, 1]; printed tables ×100"}
    fig = _paired_figures(per, rows, metrics or METRICS, n_resamples, seed)
    return params, {**fig, "report": report(fig)}


def distillation_findings(rows: list[dict], metrics: tuple[str, ...] = ("judge", "f1"), n_resamples: int = 10_000,
                          seed: int = 0) -> dict[str, dict[str, Any]]:
    """Prediction-error vs direct distillation, paired on the questions both answered (differences in [0, 1]).

    Returns:
        ``{"w/o e − Nemori-s": {metric: paired_compare}, "nemori − nemori-s": {...}}``: the first is the paper's
        like-for-like pair (both answer from semantic memory only; §4.4), the second the full method against
        Nemori-s. A pair whose systems did not both run is left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, a, b in (("w/o e − Nemori-s", "nemori-s", "nemori-no-episodic"), ("nemori − nemori-s", "nemori-s", "nemori")):
        for m in metrics:
            xa, xb = paired_scores(rows, a, b, m)
            if xa:
                out.setdefault(key, {})[m] = paired_compare(xa, xb, binary=m.startswith("judge"),
                                                            n_resamples=n_resamples, seed=seed)
    return out


def _ci(cells: dict[str, list[float]] | None) -> str:
    if not cells or not cells.get("overall") or not cells["overall"][3]:
        return "—"
    mean, low, high, _ = cells["overall"]
    return f"{100 * mean:.1f} [{100 * low:.1f}–{100 * high:.1f}]"


def _diff(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "—"
    return f"{100 * stats['diff']:+.1f} [{100 * stats['low']:+.1f}, {100 * stats['high']:+.1f}]"


def _num(value: float | None, pattern: str) -> str:
    return "—" if value is None else format(value, pattern)


def _table5(fig: dict[str, Any]) -> str:
    """Table 5 layout: one row per system in the paper's order, scores ×100 with CIs, judge paired vs baseline."""
    order = [n for n, *_ in TABLE5 if n in fig["per_system"]] + [n for n in fig["systems"] if n not in _LABELS]
    base, vs = fig["baseline"], fig["paired"]["vs"]
    rows = []
    for name in order:
        p = fig["per_system"][name]
        sc, cost = p["scores"], p["construction"] or {}
        n = next((int(c["overall"][3]) for c in sc.values() if c.get("overall")), 0)
        judge_vs = vs.get(name, {}).get("judge")
        rows.append([p["label"], name, p["management"], n, _ci(sc.get("judge")), _ci(sc.get("f1")),
                     _ci(sc.get("bleu1")), _ci(sc.get("recall_at_10")),
                     "(baseline)" if name == base else _diff(judge_vs),
                     format_p(judge_vs.get("mcnemar_p")) if judge_vs else "—",
                     "reused" if cost.get("reused") else _num(cost.get("calls_per_100"), ".1f"),
                     "reused" if cost.get("reused") else _num(cost.get("tokens_per_100"), ",.0f"),
                     _num(p["context_tokens"], ",.0f")])
    header = ["configuration", "system", "mgmt", "n", "judge", "F1", "BLEU-1", "recall@10", f"judge − {base}",
              "McNemar p", "calls / 100 turns", "tokens / 100 turns", "context tokens"]
    return md_table(header, rows)


def _stage_table(fig: dict[str, Any]) -> str:
    """Construction calls per 100 turns per stage, one row per distinct construction (systems that share it)."""
    seen: dict[str, list[str]] = {}
    costs: dict[str, dict[str, Any]] = {}
    for name, p in fig["per_system"].items():
        if p["construction"] is not None:
            seen.setdefault(p["run_dir"], []).append(name)
            costs[p["run_dir"]] = p["construction"]
    stages = [s for s in CONSTRUCTION_STAGES if any(s in c["per_stage"] for c in costs.values())]
    rows = [[", ".join(names), *("reused" if costs[d]["reused"] else
                                f"{costs[d]['per_stage'].get(s, {}).get('calls', 0):.1f} / "
                                f"{costs[d]['per_stage'].get(s, {}).get('tokens', 0):,.0f}" for s in stages)]
            for d, names in seen.items()]
    return md_table(["memory read by", *(f"{s} calls / tokens" for s in stages)], rows) if rows else "(no construction)"


def _section(key: str, value: Any) -> str:
    """A summary section the eval adds (``memory``: ``eval.memory_quality.memory_report``; ``stage_activity``:
    ``eval.stage_activity.stage_activity``) as printable text: its own table where it has one, else JSON."""
    import json

    if isinstance(value, str):
        return value
    if key == "memory" and isinstance(value, dict) and "table" in value:
        return f"{value.get('caption', '')}\n{value['table']}".strip()
    if key == "stage_activity" and isinstance(value, dict):
        try:
            from nemori_dspy.eval.stage_activity import stage_activity_table

            return stage_activity_table(activity=value)
        except (ImportError, KeyError, TypeError):  # an older or different layout: shown as it is
            pass
    return json.dumps(value, indent=1, default=str)


def _findings_lines(fig: dict[str, Any]) -> list[str]:
    from nemori_dspy.eval.metrics import paired_line

    lines = []
    for key, by_metric in fig["findings"].items():
        a, b = ("Nemori-s", "w/o e") if key.startswith("w/o e") else ("nemori-s", "nemori")
        lines += [f"prediction error vs direct distillation ({key}), " + paired_line(m, s, a, b)
                  for m, s in by_metric.items()]
    return lines or ["prediction error vs direct distillation: n/a (needs nemori-s and nemori-no-episodic / nemori)"]


def report(fig: dict[str, Any]) -> str:
    """The printed report: Table 5 layout, paired differences, construction per stage, memory and stage
    activity sections (when the eval provides them), the distillation findings."""
    parts = ["## Ablation (Table 5 layout; ×100, mean [95% CI]; judge paired with "
             f"{fig['baseline']}: bootstrap 95% CI, exact McNemar p)", "", _table5(fig), "",
             f"## Paired differences vs {fig['baseline']} on the questions both answered (×100)", "",
             "```", paired_table_from_stats(fig["paired"]), "```", "",
             "## Construction per 100 turns per stage (calls / tokens)", "", _stage_table(fig)]
    for key, title in (("memory", "Memory quality"), ("stage_activity", "Stage activity")):
        shown: set[str] = set()
        for name, p in fig["per_system"].items():
            if p.get(key) is not None and p["run_dir"] not in shown:
                shown.add(p["run_dir"])
                parts += ["", f"## {title}, memory of {name}", "", "```", _section(key, p[key]), "```"]
    parts += ["", "## Findings", "", *_findings_lines(fig)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------- running
@contextmanager
def _runtime(lm: str, base: dict[str, Any]) -> Iterator[tuple[Any, Any, Callable[[list[Any]], Any]]]:
    """(settings, runtime, judge factory) for ``lm`` (``benchmarks.lm_runtime``; ``scripted`` runs on the hashing
    embedder). The judge factory takes the calibration pairs and returns the eval's judge panel."""
    from nemori_dspy.config import NemoriSettings

    scripted = lm == SCRIPTED
    settings = NemoriSettings(**{**({"embedder": "hashing-64"} if scripted else {}), **base, **lm_overrides(lm)})
    with lm_runtime(lm, settings) as rt:
        if scripted:
            from nemori_dspy.eval.judge import JudgePanel, LLMJudge

            yield settings, rt, lambda audit: JudgePanel({"judge": LLMJudge(model_label=SCRIPTED)}, audit)
        else:
            from nemori_dspy.apps.context import locomo_judges

            yield settings, rt, lambda audit: locomo_judges(settings, rt, audit)


def _conversations(data: Path, conversations: list[str] | None, sessions: str | None) -> list[LoCoMoConversation]:
    return [slice_sessions(c, parse_sessions(sessions)) for c in load_locomo(data, conversations)]


def run(data: Path, conversations: list[str] | None, sessions: str | None, lm: str, systems: list[System],
        run_dir: Path, judge: bool = True, max_questions: int | None = None, base: dict[str, Any] | None = None,
        resume: bool = False, progress: bool = True,
        on_group: Callable[[list[GroupRun]], None] | None = None) -> list[GroupRun]:
    """Build (or reuse) each construction's memory of the slice and answer with its systems (``run_locomo``).

    Args:
        data: ``locomo10.json`` or a file in its schema; ``conversations``/``sessions`` cut the slice.
        lm: ``scripted``, ``local:<size>`` or a litellm model (the answer and construction model).
        systems: from ``eval.systems.parse_systems``; grouped by :func:`construction_groups`.
        run_dir: one sub-folder per construction (``results.jsonl``, ``summary.json``, ``tables.md``).
        judge: score with the LLM judge (``base["judge_model"]``, else the answer model).
        max_questions: per conversation, stratified by category (the same questions for every system).
        base: settings over the defaults (e.g. ``{"judge_model": "local:1.5b", "cache": False}``).
        resume: continue the run folders without redoing answered questions.
        on_group: called with the groups run so far after each one.

    Returns:
        One :class:`GroupRun` per construction, in order.

    Raises:
        DatasetError: bad data, slice or conversation ids (``eval.locomo``).
    """
    from nemori_dspy.apps.context import memory_provider
    from nemori_dspy.eval.judge_audit import locomo_audit_pairs

    convs = _conversations(data, conversations, sessions)
    groups = construction_groups(systems)
    done: list[GroupRun] = []
    with _runtime(lm, base or {}) as (settings, rt, make_judge):
        label = parse_sessions(sessions).label() if sessions else None  # keyed as eval locomo keys the slice
        provider, _ = memory_provider(settings, rt, dataset_sha256(data), None, label)
        for i, group in enumerate(groups):
            opts = EvalOptions(systems=group, max_questions=max_questions, resume=resume, progress=progress)
            audit = locomo_audit_pairs(convs, opts.categories, max_questions, settings.judge_audit) if i == 0 else []
            out = run_dir / f"{i + 1}-{group[0].name}"
            summary = run_locomo(provider, convs, opts, make_judge(audit) if judge else None, out)
            done.append(GroupRun([s.name for s in group], out, summary))
            if on_group is not None:
                on_group(done)
    return done


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.ablation``: run, print the report, write the result file; returns 0.

    Raises:
        ConfigError: unknown system or slice name; DatasetError: bad data or slice.
    """
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", type=Path, default=None, help="locomo10.json or a file in its schema (required "
                                                             "unless --merge)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RESULT",
                    help="no run: merge result files of one slice run a construction group at a time, pair every "
                         "system with nemori again, print the report and write the merged file")
    ap.add_argument("--lm", default="local:0.5b", help="'local:0.5b' (default), 'local:1.5b', a litellm model, "
                                                       "or 'scripted' (no model; smoke tests)")
    ap.add_argument("--slice", default=None, help="a named slice (eval.locomo.SLICES); else --conversations/--sessions")
    ap.add_argument("--conversations", default=None, help="comma-separated sample ids (default: all)")
    ap.add_argument("--sessions", default=None, help="sessions A-B of each conversation (default: all)")
    ap.add_argument("--judge-model", default=None, help="the LLM judge (e.g. local:1.5b; default: the answer model)")
    ap.add_argument("--no-judge", action="store_true", help="no LLM judge (F1, BLEU-1 and recall only)")
    ap.add_argument("--max-questions", type=int, default=None, help="per conversation, stratified by category")
    ap.add_argument("--systems", default=None, help=f"comma-separated (default: {','.join(default_systems())})")
    ap.add_argument("--run-dir", type=Path, default=None, help="run folders (default runs/ablation-<time>)")
    ap.add_argument("--resume", action="store_true", help="continue --run-dir without redoing answered questions")
    ap.add_argument("--fresh-memory", action="store_true", help="build every memory anew under --run-dir (so its "
                    "construction cost is measured) instead of reusing stores built by earlier runs")
    ap.add_argument("--cache", action="store_true", help="keep DSPy's response cache on (default off: a cache hit "
                    "is no call, so it would hide the construction cost measured)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the result file goes")
    a = ap.parse_args(argv)
    if a.merge:
        params, fig = merge_results(a.merge)
        name = f"ablation-{_slug(params['lm'] or 'lm')}-{_slug(params['slice'] or params['sessions'] or 'all')}-merged"
        path = write_result(name, params, fig, a.out)
        print(fig["report"])
        print(f"wrote {path}")
        return 0
    if a.data is None:
        ap.error("--data is required (locomo10.json), unless --merge")
    ids = [s.strip() for s in a.conversations.split(",") if s.strip()] if a.conversations else None
    sessions = a.sessions
    if a.slice:
        ids, sessions = resolve_slice(a.slice)
    systems = parse_systems(a.systems) if a.systems else [SYSTEMS[n] for n in default_systems()]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = a.run_dir or Path(f"runs/ablation-{stamp}")
    base: dict[str, Any] = {"cache": a.cache}
    if a.judge_model:
        base["judge_model"] = a.judge_model
    if a.fresh_memory:
        base["cache_dir"] = str(run_dir / "memory-cache")
    name = f"ablation-{_slug(a.lm)}-{_slug(a.slice or sessions or 'all')}-{stamp}"
    params = {"lm": a.lm, "judge_model": a.judge_model, "judge": not a.no_judge, "data": str(a.data),
              "data_sha256": dataset_sha256(a.data), "slice": a.slice, "conversations": ids, "sessions": sessions,
              "max_questions": a.max_questions, "systems": [s.name for s in systems], "run_dir": str(run_dir),
              "fresh_memory": a.fresh_memory, "dspy_cache": a.cache,
              "units": "scores and differences in [0, 1]; printed tables ×100"}
    turns = sum(len(c.messages) for c in _conversations(a.data, ids, sessions))
    t0 = time.perf_counter()
    state: dict[str, Any] = {}

    def write(groups: list[GroupRun]) -> None:
        state["fig"] = figures(groups, turns)
        state["path"] = write_result(name, {**params, "complete": len(groups) == len(construction_groups(systems)),
                                            "seconds": round(time.perf_counter() - t0, 1), "turns": turns},
                                     {**state["fig"], "report": report(state["fig"])}, a.out)

    run(a.data, ids, sessions, a.lm, systems, run_dir, judge=not a.no_judge, max_questions=a.max_questions,
        base=base, resume=a.resume, on_group=write)
    print(report(state["fig"]))
    print(f"wrote {state['path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
