"""Print a finished MLflow eval run as text: systems side by side per metric and category, plus cost.

Reads the metrics that ``eval/tracking.py`` logs (``log_eval_run``):

* ``<system>.<metric>.<category>``: mean score in [0, 1], e.g. ``nemori.judge.overall``,
  ``no-memory.f1.temporal`` (category names from ``eval.locomo.CATEGORY_NAMES``, LongMemEval question
  types and ``abstention``, ``overall``, LongMemEval's ``task-averaged``);
* ``<system>.n.<category>`` or ``n.<category>``: number of questions in the cell;
* ``cost.<stage>.<field>``: per-stage LLM usage (``types.Usage`` fields);
* ``judge_audit.<judge>.<stat>``: the judge on its calibration set (``eval/judge_audit.py``).

Child runs (tag ``mlflow.parentRunId``) add their systems as further columns; a child's
un-prefixed ``<metric>.<category>`` metrics are shown under the child's run name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.locomo import CATEGORY_NAMES, SCORED_CATEGORIES
from nemori_dspy.eval.longmemeval import QUESTION_TYPES
from nemori_dspy.eval.judge_audit import audit_table
from nemori_dspy.eval.metrics import cost_table, format_table

__all__ = ["report", "compare", "parse_metrics", "audit_metrics", "scores_from_answers", "ROW_METRICS", "paired_runs",
           "paired_runs_table"]

#: row order: LoCoMo categories, LongMemEval question types and abstention, overall, LongMemEval's task average.
CATEGORIES = [*(CATEGORY_NAMES[c] for c in SCORED_CATEGORIES), *QUESTION_TYPES, "abstention", "overall", "task-averaged"]
_NON_SYSTEM = {"cost", "counter", "n", "judge_audit"}
_PARENT_TAG = "mlflow.parentRunId"

#: metric columns of an answer row that ``scores_from_answers`` averages (as the eval's tables do).
ROW_METRICS = ["judge", "judge_strict", "f1", "bleu1", "f1_locomo", "recall_at_1", "recall_at_2", "recall_at_5",
               "recall_at_10"]

Scores = dict[str, dict[tuple[str, str], float]]
"""``{system: {(metric, category): value}}``; metric ``"n"`` holds question counts."""


def parse_metrics(metrics: dict[str, float], default_system: str) -> tuple[Scores, dict[str, dict[str, float]]]:
    """Split one run's MLflow metrics into scores and per-stage cost.

    Returns ``(scores, cost)``: ``scores`` = ``{system: {(metric, category): value}}``
    (``n.<category>`` and un-prefixed ``<metric>.<category>`` go to ``default_system``),
    ``cost`` = ``{stage: {field: value}}`` from ``cost.<stage>.<field>``. Other metrics
    (``counter.*``, ``ingest_seconds``, categories not in :data:`CATEGORIES`) are ignored.
    """
    scores: Scores = {}
    cost: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        parts = name.split(".")
        if parts[0] == "cost" and len(parts) == 3:
            cost.setdefault(parts[1], {})[parts[2]] = value
        elif len(parts) == 3 and parts[2] in CATEGORIES and parts[0] not in _NON_SYSTEM:
            scores.setdefault(parts[0], {})[(parts[1], parts[2])] = value
        elif len(parts) == 2 and parts[1] in CATEGORIES and parts[0] not in _NON_SYSTEM - {"n"}:
            scores.setdefault(default_system, {})[(parts[0], parts[1])] = value
    return scores, cost


def audit_metrics(metrics: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """``{judge: {"on_gold", "on_wrong", "overall", "n_gold", "n_wrong", "n"}}`` from ``judge_audit.*`` metrics."""
    out: dict[str, dict[str, float | None]] = {}
    for name, value in metrics.items():
        parts = name.split(".")
        if parts[0] == "judge_audit" and len(parts) == 3:
            out.setdefault(parts[1], dict.fromkeys(("on_gold", "on_wrong", "overall", "n_gold", "n_wrong", "n")))
            out[parts[1]][parts[2]] = int(value) if parts[2].startswith("n") else value
    return out


def _client(tracking_uri: str) -> Any:
    """An MlflowClient; a ``sqlite:///`` URI whose file does not exist is an error (not a new empty store).

    Raises:
        ConfigError: the SQLite tracking file is missing.
    """
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri.removeprefix("sqlite:///"))
        if not path.exists():
            raise ConfigError(f"no MLflow store at {path.resolve()}. Fix: run `nemori-dspy eval locomo` from this "
                              "folder first, or pass --tracking-uri (e.g. sqlite:////abs/path/mlruns.db).")

    return MlflowClient(tracking_uri=tracking_uri)


def _latest_run(client: Any, experiment: str) -> Any:
    """The most recently started finished top-level run of ``experiment``."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"no MLflow experiment named {experiment!r} in this tracking store. Fix: run "
                          "`nemori-dspy eval locomo ...` first, or pass the --tracking-uri / --experiment the "
                          "eval logged to (it prints them).")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    top = [r for r in runs if _PARENT_TAG not in r.data.tags]
    if not top:
        raise ConfigError(f"no finished top-level run in MLflow experiment {experiment!r}. Fix: let an eval "
                          "finish (or --resume it), or pass --run-id of the run to show.")
    return top[0]


def _get_run(client: Any, run_id: str) -> Any:
    """The run ``run_id``; raises ``ConfigError`` (not MLflow's traceback) when it is not in this store."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        raise ConfigError(f"no MLflow run {run_id!r} in this tracking store ({str(exc).splitlines()[0][:200]}). Fix: "
                          "copy the id from the 'MLflow run …' line eval printed, or omit --run-id for the latest "
                          "run; pass --tracking-uri if the eval logged elsewhere.") from None


def _children(client: Any, run: Any) -> list[Any]:
    runs = client.search_runs([run.info.experiment_id], filter_string=f"tags.`{_PARENT_TAG}` = '{run.info.run_id}'",
                              order_by=["attributes.start_time ASC"], max_results=200)
    return list(runs)


def _merge(into: Scores, scores: Scores, run_name: str) -> None:
    """Add a child's systems; a name already present is skipped when its scores repeat the ones shown
    (a per-system child run of the same eval), else added as ``<run name>/<system>``."""
    for system, cells in scores.items():
        if system in into and all(into[system].get(k) == v for k, v in cells.items() if k[0] != "n"):
            continue
        label = system if system not in into else f"{run_name}/{system}"
        into[label] = cells


def _run_scores(run: Any) -> tuple[Scores, dict[str, dict[str, float]]]:
    """:func:`parse_metrics` of one run; run-wide ``n.<category>`` counts are copied into each
    of its systems (unless a system logs its own) instead of forming a column of their own."""
    name = run.info.run_name or run.info.run_id
    scores, cost = parse_metrics(run.data.metrics, name)
    own = scores.get(name, {})
    if own and all(metric == "n" for metric, _ in own):
        del scores[name]
        for cells in scores.values():
            for key, value in own.items():
                cells.setdefault(key, value)
    return scores, cost


def _answer_rows(client: Any, run: Any) -> list[dict[str, Any]]:
    """The rows of the run's live ``answers.json`` table (``eval.tracking``), [] when it has none."""
    import json as _json
    import tempfile

    from mlflow.exceptions import MlflowException

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run.info.run_id, "answers.json", tmp)
            table = _json.loads(Path(path).read_text())
    except (MlflowException, OSError, ValueError):
        return []
    cols = table.get("columns") or []
    return [dict(zip(cols, row)) for row in table.get("data") or []]


def scores_from_answers(rows: list[dict[str, Any]]) -> Scores:
    """Scores of answer rows (``results.jsonl`` / ``answers.json`` rows: ``system``, ``category_name`` and metric
    columns): per system the mean of every numeric metric per category and ``overall`` (``eval.metrics.
    category_scores``, grouped by the rows' own ``category_name``), with ``n`` counts."""
    from nemori_dspy.eval.metrics import category_scores

    names = list(dict.fromkeys(str(r.get("category_name")) for r in rows))
    groups = [(name, lambda r, name=name: str(r.get("category_name")) == name) for name in names]
    out: Scores = {}
    for m in (m for m in ROW_METRICS if any(isinstance(r.get(m), (int, float)) for r in rows)):
        for system, cells in category_scores(rows, m, groups=groups).items():
            mine = out.setdefault(system, {})
            for cat, (mean, _, _, n) in cells.items():
                if n:  # n: the rows of the category (F1 is in every row), so the largest count over the metrics
                    mine[(m, cat)], mine[("n", cat)] = mean, max(n, mine.get(("n", cat), 0))
    return out


def _score_table(scores: Scores) -> str:
    """Rows (metric, category), one column per system; cells ``mean×100 (n=count)``."""
    systems = list(scores)
    metrics = list(dict.fromkeys(m for cells in scores.values() for (m, _) in cells if m != "n"))
    body = []
    for metric in metrics:
        for cat in CATEGORIES:
            cells = [_cell(scores[s].get((metric, cat)), scores[s].get(("n", cat))) for s in systems]
            if any(c != "-" for c in cells):
                body.append([metric, cat, *cells])
    return format_table(["metric", "category", *systems], body, key_cols=2)


def _cell(value: float | None, n: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" + (f" (n={int(n)})" if n is not None else "")


def report(tracking_uri: str, run_id: str | None = None, experiment: str = "nemori-dspy") -> str:
    """Text report of one finished eval run logged by ``eval.tracking.log_eval_run``.

    Args:
        tracking_uri: MLflow tracking URI, e.g. ``"sqlite:///mlruns.db"``.
        run_id: the run to show; ``None`` → the latest finished top-level run of ``experiment``.
        experiment: MLflow experiment name (used only when ``run_id`` is ``None``).

    Returns:
        A header line (run name, id, status), a score table (rows = metric × category,
        columns = the run's systems then each child run's systems; cells = mean × 100 with
        ``(n=...)``), the judge audit when ``judge_audit.*`` metrics exist and, when ``cost.*``
        metrics exist, :func:`eval.metrics.cost_table`.
    """
    client = _client(tracking_uri)
    run = _get_run(client, run_id) if run_id else _latest_run(client, experiment)
    scores, cost = _run_scores(run)
    for child in _children(client, run):
        _merge(scores, _run_scores(child)[0], child.info.run_name or child.info.run_id)
    heading = "## Scores (×100)"
    if not scores:  # a run that did not finish (FAILED, KILLED, RUNNING) logged its answers, not its scores
        scores = scores_from_answers(_answer_rows(client, run))
        heading = "## Scores (×100) of the answers logged so far (answers.json; the run logged no score metrics)"
    parts = [f"run {run.info.run_name or run.info.run_id} ({run.info.run_id}, {run.info.status})", "",
             heading, _score_table(scores) if scores else "(no score metrics and no answers logged)"]
    audit = audit_metrics(run.data.metrics)
    if audit:
        parts += ["", "## Judge audit (calibration set, ×100)", audit_table(audit)]
    if cost:
        local = run.data.params.get("config.model") == "local"
        parts += ["", "## LLM usage per stage", cost_table(cost, local=local)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------- two runs side by side
Cells = dict[tuple[str, str], str]
"""``{(row label, category): cell text}`` of one run in the comparison."""


def _rows_of(client: Any, run: Any) -> list[dict[str, Any]] | None:
    """The eval's answer rows: the ``results.jsonl`` artifact, else the live ``answers.json`` table; None if neither."""
    import json
    import tempfile

    from mlflow.exceptions import MlflowException

    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if "results.jsonl" in names:
                path = client.download_artifacts(run.info.run_id, "results.jsonl", tmp)
                with open(path) as f:
                    return [json.loads(x) for x in f if x.strip()]
            if "answers.json" in names:
                path = client.download_artifacts(run.info.run_id, "answers.json", tmp)
                with open(path) as f:
                    table = json.load(f)
                return [dict(zip(table["columns"], row)) for row in table["data"]]
        except (MlflowException, OSError, ValueError, KeyError):
            return None
    return None


def _ci_cell(mean: float, low: float, high: float, n: int | None) -> str:
    return f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]" + (f" n={n}" if n is not None else "")


def _groups_of(run: Any, rows: list[dict[str, Any]]) -> list[Any] | None:
    """The row groups of an eval run's tables: LongMemEval's question types for a LongMemEval run, else None
    (LoCoMo categories 1-4)."""
    if run.data.params.get("benchmark") != "longmemeval":
        return None
    from nemori_dspy.eval.longmemeval_runner import LONGMEMEVAL_GROUPS

    return [g for g in LONGMEMEVAL_GROUPS if any(g[1](r) for r in rows)]


def paired_runs(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]],
                groups: list[Any] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Two runs' answers to the same questions, paired per system (``eval.metrics.paired_stats``).

    Args:
        rows_a, rows_b: answer rows (``results.jsonl`` / ``answers.json``) of run A and run B.
        groups: row groups the questions must belong to (None: LoCoMo categories 1-4).

    Returns:
        ``{label: {metric: paired_compare stats}}`` (B − A, scores in [0, 1]); ``label`` is each system both runs
        answered with, or ``"<system A> → <system B>"`` when each run has a single system and the names differ.
        Questions are paired by ``(sample_id, index)``; ``{}`` when no question was answered in both.
    """
    from nemori_dspy.eval.metrics import paired_stats

    sys_a = list(dict.fromkeys(str(r.get("system", "nemori")) for r in rows_a))
    sys_b = list(dict.fromkeys(str(r.get("system", "nemori")) for r in rows_b))
    pairs = [(s, s, s) for s in sys_a if s in sys_b]
    if not pairs and len(sys_a) == len(sys_b) == 1:
        pairs = [(f"{sys_a[0]} → {sys_b[0]}", sys_a[0], sys_b[0])]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, a, b in pairs:
        rows = ([{**r, "system": "A"} for r in rows_a if str(r.get("system", "nemori")) == a]
                + [{**r, "system": "B"} for r in rows_b if str(r.get("system", "nemori")) == b])
        vs = paired_stats(rows, ["A", "B"], groups=groups)["vs"].get("B")
        if vs:
            out[label] = vs
    return out


def paired_runs_table(paired: dict[str, dict[str, dict[str, Any]]]) -> str:
    """:func:`paired_runs` as text: system, metric, n, A, B (×100), B − A [95% CI], B wins/A wins, McNemar p."""
    from nemori_dspy.eval.metrics import format_p

    body = [[label, metric, str(s["n"]), f"{100 * s['mean_a']:.1f}", f"{100 * s['mean_b']:.1f}",
             f"{100 * s['diff']:+.1f} [{100 * s['low']:+.1f}, {100 * s['high']:+.1f}]",
             f"{s['wins']}/{s['losses']}" if "wins" in s else "-", format_p(s.get("mcnemar_p"))]
            for label, by_metric in paired.items() for metric, s in by_metric.items()]
    header = ["system", "metric", "n", "A", "B", "B−A [95% CI]", "B wins/A wins", "McNemar p"]
    return format_table(header, body, key_cols=2) if body else "(no question answered in both runs)"


def _paired_section(client: Any, a: Any, b: Any) -> list[str]:
    """The compare report's paired section: both eval runs' answer rows paired (nothing for optimize runs)."""
    head = ("## Paired differences B − A on the questions both runs answered (×100; paired bootstrap 95% CI; "
            "judge: exact McNemar p)")
    if _is_optimize(a) or _is_optimize(b):
        return ["", head, "(an optimize run has no answer rows: its dev before/after pairing is printed by optimize)"]
    rows_a, rows_b = _rows_of(client, a), _rows_of(client, b)
    if not rows_a or not rows_b:
        return ["", head, "(a run logged no answer rows: results.jsonl / answers.json)"]
    return ["", head, paired_runs_table(paired_runs(rows_a, rows_b, _groups_of(a, rows_a)))]


def _eval_cells(client: Any, run: Any) -> Cells:
    """Score cells of an eval run: ``(system/metric, category)`` → mean [95% CI] n, from its answer rows
    (``eval.metrics.category_scores``); without rows, the logged means (no CI)."""
    from nemori_dspy.eval.metrics import category_scores

    rows = _rows_of(client, run)
    cells: Cells = {}
    if rows:
        groups = _groups_of(run, rows)
        metrics = [m for m in ("judge", "judge_strict", "f1", "bleu1", "f1_locomo")
                   if any(isinstance(r.get(m), (int, float)) for r in rows)]
        for metric in metrics:
            for system, by_cat in category_scores(rows, metric, None, groups).items():
                for cat, (mean, low, high, n) in by_cat.items():
                    if n:
                        cells[(f"{system} {metric}", cat)] = _ci_cell(mean, low, high, n)
        return cells
    scores, _ = _run_scores(run)
    for system, by_key in scores.items():
        for (metric, cat), value in by_key.items():
            if metric != "n":
                cells[(f"{system} {metric}", cat)] = _cell(value, by_key.get(("n", cat)))
    return cells


def _optimize_cells(run: Any) -> Cells:
    """Score cells of an optimize run: ``<stage> dev before|after`` overall (with CI) and per category."""
    m, cells = run.data.metrics, {}
    for name in m:
        parts = name.split(".")
        if len(parts) == 3 and parts[1] == "dev" and parts[2] in ("before", "after"):
            key = f"{parts[0]}.dev.{parts[2]}"
            cells[(f"{parts[0]} dev {parts[2]}", "overall")] = _ci_cell(
                m[key], m.get(f"{key}.low", m[key]), m.get(f"{key}.high", m[key]), int(m.get(f"{parts[0]}.dev.n", 0)) or None)
        elif len(parts) == 4 and parts[1] == "dev" and parts[3] in ("before", "after"):
            cells[(f"{parts[0]} dev {parts[3]}", parts[2])] = f"{100 * m[name]:.1f}"
    return cells


def _is_optimize(run: Any) -> bool:
    return any(k.split(".")[1:3] == ["dev", "before"] for k in run.data.metrics if k.count(".") >= 2)


def _construction_cost(run: Any) -> dict[str, dict[str, float]]:
    """``{stage: usage}`` of memory construction: ``construction.*`` metrics, else the construction stages of
    ``cost.*`` (runs logged before construction cost was logged apart), else an optimize run's ``construction.calls``."""
    from nemori_dspy.eval.runner import CONSTRUCTION_STAGES

    out: dict[str, dict[str, float]] = {}
    for name, value in run.data.metrics.items():
        parts = name.split(".")
        if parts[0] == "construction" and len(parts) == 3:
            out.setdefault(parts[1], {})[parts[2]] = value
        if len(parts) == 4 and parts[1] == "cost" and parts[2] in CONSTRUCTION_STAGES:  # optimize: <stage>.cost.*
            usage = out.setdefault(parts[2], {})
            usage[parts[3]] = usage.get(parts[3], 0.0) + value
    if not out:
        out = {s: u for s, u in parse_metrics(run.data.metrics, "")[1].items() if s in CONSTRUCTION_STAGES}
    return out


def _prompt_diff(a: Any, b: Any) -> list[list[str]]:
    """Rows (stage, hash A, hash B, version A, version B, same?) over the ``prompt.<stage>`` params of two runs."""
    pa, pb = a.data.params, b.data.params
    stages = sorted({k.split(".", 1)[1] for k in (*pa, *pb) if k.startswith("prompt.")})
    rows = []
    for s in stages:
        ha, hb = pa.get(f"prompt.{s}", "-"), pb.get(f"prompt.{s}", "-")
        rows.append([s, ha, hb, pa.get(f"prompt_version.{s}", "-"), pb.get(f"prompt_version.{s}", "-"),
                     "same" if ha == hb else "DIFFERS"])
    return rows


def _run_label(run: Any) -> str:
    return f"{run.info.run_name or run.info.run_id} ({run.info.run_id}, {run.info.status})"


def compare(tracking_uri: str, run_a: str | None, run_b: str, experiment: str = "nemori-dspy") -> str:
    """Two runs side by side: scores per category with 95% CIs, construction cost per stage, and which
    stage prompts differ.

    Args:
        tracking_uri: MLflow tracking URI, e.g. ``"sqlite:///mlruns.db"``.
        run_a: the first run (``None`` → the latest finished top-level run of ``experiment``).
        run_b: the second run. Either may be an eval run (scores from its answer rows: mean ×100 [95% CI] n)
            or an optimize run (its ``<stage>.dev.before/after`` metrics).
    Returns:
        The text: a header per run, a score table (rows = system + metric × category, columns A, B), the
        paired differences B − A of two eval runs over the questions both answered (:func:`paired_runs`), a
        construction cost table per run (``eval.metrics.cost_table``) and a prompt table (stage, hash and
        registry version in A and B, ``same`` / ``DIFFERS``).
    Raises:
        ConfigError: a run is not in the store.
    """
    client = _client(tracking_uri)
    a = _get_run(client, run_a) if run_a else _latest_run(client, experiment)
    b = _get_run(client, run_b)
    ca = _optimize_cells(a) if _is_optimize(a) else _eval_cells(client, a)
    cb = _optimize_cells(b) if _is_optimize(b) else _eval_cells(client, b)
    keys = list(dict.fromkeys([*ca, *cb]))
    order = {c: i for i, c in enumerate(CATEGORIES)}
    keys.sort(key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))
    body = [[label, cat, ca.get((label, cat), "-"), cb.get((label, cat), "-")] for label, cat in keys]
    parts = [f"A: {_run_label(a)}", f"B: {_run_label(b)}", "", "## Scores (×100, mean [95% CI] n)",
             format_table(["system / metric", "category", "A", "B"], body, key_cols=2) if body else "(no scores)"]
    parts += _paired_section(client, a, b)
    for label, run in (("A", a), ("B", b)):
        cost = _construction_cost(run)
        local = run.data.params.get("config.model") == "local"
        parts += ["", f"## Construction cost per stage, {label}",
                  cost_table(cost, local=local) if cost else "(no construction cost logged)"]
    diff = _prompt_diff(a, b)
    parts += ["", "## Prompts (hash of the instruction + fields + demos that ran; registry version)"]
    parts.append(format_table(["stage", "hash A", "hash B", "version A", "version B", ""], diff)
                 if diff else "(no prompt.* params)")
    differ = [r[0] for r in diff if r[-1] == "DIFFERS"]
    parts.append(f"prompts that differ: {', '.join(differ)}" if differ else "no stage prompt differs")
    return "\n".join(parts)
