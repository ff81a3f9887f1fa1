"""MLflow logging of an eval run: resolved config, prompt hashes, per-stage cost, scores, artifacts.

Tracking URI: ``settings.mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a local
``sqlite:///mlruns.db`` (needs full ``mlflow``, not ``mlflow-skinny``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..config import NemoriSettings
from ..signatures import SIGNATURES, signature_hash, signature_text

__all__ = ["tracking_uri", "log_eval_run", "flatten"]


def tracking_uri(settings: NemoriSettings) -> str:
    """The MLflow tracking URI this run uses."""
    return settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns.db"


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


def log_eval_run(settings: NemoriSettings, summary: dict[str, Any], out_dir: Path, extra_params: dict[str, Any],
                 run_name: str | None = None) -> str:
    """Log one LoCoMo run to MLflow; returns the run id.

    Params: resolved config (no secrets), ``extra_params`` (dataset, model label, server flags...),
    ``prompt.<stage>`` hashes, judge model + prompt hash. Metrics: ``<system>.<metric>.<category>``,
    ``cost.<stage>.{calls,cache_hits,failures,input_tokens,output_tokens,seconds,cost_usd}``, counters.
    Artifacts: everything in ``out_dir`` plus ``prompts.json`` (full signature texts).
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(settings))
    mlflow.set_experiment(settings.mlflow_experiment)
    with mlflow.start_run(run_name=run_name) as run:
        params = flatten(settings.public_dict(), "config.")
        params.update(flatten(extra_params))
        params.update({f"prompt.{k}": signature_hash(v) for k, v in SIGNATURES.items()})
        if summary.get("judge"):
            params.update(flatten(summary["judge"], "judge."))
        mlflow.log_params(params)
        metrics: dict[str, float] = {}
        for system, scores in summary["scores"].items():
            metrics.update({f"{system}.{k}": float(v) for k, v in scores.items()})
        for stage, usage in summary["usage"].items():
            metrics.update({f"cost.{stage}.{k}": float(v) for k, v in usage.items()})
        metrics.update({f"counter.{k}": float(v) for k, v in summary["counters"].items()})
        metrics["ingest_seconds"] = float(summary["ingest_seconds"])
        mlflow.log_metrics(metrics)
        mlflow.log_dict({k: json.loads(signature_text(v)) for k, v in SIGNATURES.items()}, "prompts.json")
        mlflow.log_artifacts(str(out_dir))
        return run.info.run_id
