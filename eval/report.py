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

from typing import Any

from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.locomo import CATEGORY_NAMES, SCORED_CATEGORIES
from nemori_dspy.eval.longmemeval import QUESTION_TYPES
from nemori_dspy.eval.judge_audit import audit_table
from nemori_dspy.eval.metrics import cost_table, format_table

__all__ = ["report", "parse_metrics", "audit_metrics"]

#: row order: LoCoMo categories, LongMemEval question types and abstention, overall, LongMemEval's task average.
CATEGORIES = [*(CATEGORY_NAMES[c] for c in SCORED_CATEGORIES), *QUESTION_TYPES, "abstention", "overall", "task-averaged"]
_NON_SYSTEM = {"cost", "counter", "n", "judge_audit"}
_PARENT_TAG = "mlflow.parentRunId"

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
    parts = [f"run {run.info.run_name or run.info.run_id} ({run.info.run_id}, {run.info.status})", "",
             "## Scores (×100)", _score_table(scores) if scores else "(no score metrics)"]
    audit = audit_metrics(run.data.metrics)
    if audit:
        parts += ["", "## Judge audit (calibration set, ×100)", audit_table(audit)]
    if cost:
        local = run.data.params.get("config.model") == "local"
        parts += ["", "## LLM usage per stage", cost_table(cost, local=local)]
    return "\n".join(parts)
