"""MLflow logging of an eval run: one parent run, one child run per system.

Parent: resolved config (no secrets), dataset checksum, server flags, the prompt of every signature
registered in MLflow's prompt registry (a changed instruction makes a new version; the version is a
param), judge model + prompt hash (per judge), the judge audit, per-stage cost, counters, artifacts (per-question JSONL, tables,
summary, charts, program state, full prompt texts). Child ``<system>``: that system's scores.
Tracking URI: ``settings.mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns.db``
(the sqlite backend needs full ``mlflow``, not ``mlflow-skinny``).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from nemori_dspy.config import NemoriSettings
from nemori_dspy.signatures import SIGNATURES, signature_hash, signature_text

__all__ = ["tracking_uri", "log_eval_run", "flatten", "register_prompts"]

log = logging.getLogger(__name__)


def tracking_uri(settings: NemoriSettings) -> str:
    """The MLflow tracking URI this run uses."""
    return settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns.db"


def artifact_location(uri: str) -> str | None:
    """For a ``sqlite:///<dir>/x.db`` tracking URI, ``file://<dir>/mlruns``: artifacts live beside the
    database instead of in whatever folder the process runs from. None for other URIs (server default)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()


def _set_experiment(mlflow: Any, uri: str, name: str) -> None:
    """Make ``name`` the active experiment, creating it with ``artifact_location(uri)`` if new."""
    if mlflow.get_experiment_by_name(name) is None:
        mlflow.create_experiment(name, artifact_location=artifact_location(uri))
    mlflow.set_experiment(name)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dict → ``{"a.b": "value"}`` with values as short strings (MLflow params)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


def register_prompts(prefix: str = "nemori-dspy") -> dict[str, int]:
    """Register each signature's full text as ``<prefix>-<stage>`` unless the latest version is identical.

    Returns ``{stage: version}``. Needs an MLflow backend with a prompt registry (sqlite/postgres/server).
    """
    import mlflow

    versions: dict[str, int] = {}
    for stage, sig in SIGNATURES.items():
        name, text = f"{prefix}-{stage.replace('_', '-')}", signature_text(sig)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cur = mlflow.genai.load_prompt(f"prompts:/{name}@latest", allow_missing=True)
            if cur is None or cur.template != text:
                cur = mlflow.genai.register_prompt(name=name, template=text,
                                                   commit_message=f"signature hash {signature_hash(sig)}",
                                                   tags={"signature": sig.__name__, "hash": signature_hash(sig)})
        versions[stage] = int(cur.version)
    return versions


def _charts(summary: dict[str, Any], out_dir: Path) -> None:
    from nemori_dspy.eval.charts import category_bar_chart, cost_by_stage_chart

    metric = (summary.get("judge_metrics") or (["judge"] if summary.get("judge") else ["f1"]))[0]
    try:
        category_bar_chart(summary["rows"], metric, summary["systems"], out_dir / f"scores_by_category_{metric}.png",
                           groups=summary.get("groups"), benchmark=summary.get("benchmark", "LoCoMo"))
        cost_by_stage_chart(summary["construction_usage"] or summary["usage"], out_dir / "cost_by_stage.png")
    except Exception as exc:  # a chart must never cost the run its record
        log.warning("chart failed: %s", exc)


def log_eval_run(settings: NemoriSettings, summary: dict[str, Any], out_dir: Path, extra_params: dict[str, Any],
                 run_name: str | None = None) -> str:
    """Log one eval (parent run + a child per system); returns the parent run id.

    Metric names: ``<system>.<metric>.<category>`` (e.g. ``nemori.judge.overall``, ``n.temporal``),
    ``cost.<stage>.{calls,cache_hits,failures,input_tokens,output_tokens,seconds,cost_usd}``, ``counter.<name>``,
    ``judge_audit.<judge>.{on_gold,on_wrong,overall,n_gold,n_wrong,n}`` (the judge on its calibration set).
    Params: ``<judge>.{model,prompt_hash,failures}`` per judge (``judge``, ``judge_strict``).
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(settings))
    _set_experiment(mlflow, tracking_uri(settings), settings.mlflow_experiment)
    if "rows" in summary:
        _charts(summary, out_dir)
    with mlflow.start_run(run_name=run_name) as run:
        params = flatten(settings.public_dict(), "config.")
        params.update(flatten(extra_params))
        params.update({f"prompt.{k}": signature_hash(v) for k, v in SIGNATURES.items()})
        try:
            params.update({f"prompt_version.{k}": str(v) for k, v in register_prompts().items()})
        except Exception as exc:  # e.g. a file-store backend without a prompt registry
            log.warning("prompt registry unavailable (%s); prompts are still logged as prompts.json", exc)
        for name, info in (summary.get("judges") or ({"judge": summary["judge"]} if summary.get("judge") else {})).items():
            params.update(flatten(info, f"{name}."))  # judge.model, judge.prompt_hash, judge_strict.prompt_hash
        params["systems"] = ",".join(summary.get("systems", summary["scores"].keys()))
        mlflow.log_params(params)
        metrics: dict[str, float] = {}
        for system, scores in summary["scores"].items():
            metrics.update({f"{system}.{k}": float(v) for k, v in scores.items()})
        for stage, usage in summary["usage"].items():
            metrics.update({f"cost.{stage}.{k}": float(v) for k, v in usage.items()})
        metrics.update({f"counter.{k}": float(v) for k, v in summary["counters"].items()})
        metrics.update({f"embedding.{k}": float(v) for k, v in (summary.get("embedding_usage") or {}).items()})
        for name, audit in (summary.get("judge_audit") or {}).items():
            metrics.update({f"judge_audit.{name}.{k}": float(v) for k, v in audit.items() if v is not None})
        metrics["ingest_seconds"] = float(summary["ingest_seconds"])
        mlflow.log_metrics(metrics)
        mlflow.log_dict({k: json.loads(signature_text(v)) for k, v in SIGNATURES.items()}, "prompts.json")
        mlflow.log_artifacts(str(out_dir))
        for system, scores in summary["scores"].items():
            with mlflow.start_run(run_name=system, nested=True):
                mlflow.log_param("system", system)
                mlflow.log_metrics({f"{system}.{k}": float(v) for k, v in scores.items()})
        return run.info.run_id
