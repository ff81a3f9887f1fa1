"""MLflow record of one optimization: a run opened when it starts (DSPy autolog logs the compile and the
trial evaluations into it), params (stage, optimizer, budget, models, train/dev ids, slice, dataset
checksum), metrics (dev before/after overall and per category, cost of optimizing per model), the compiled
program as an artifact, and the tuned instructions registered as new versions of ``nemori-dspy-<stage>`` with the
alias ``@tuned`` pointing at them.
Experiment: ``<settings.mlflow_experiment>-optimize``.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from nemori_dspy.config import NemoriSettings
from nemori_dspy.eval.tracking import (PROMPT_PREFIX, TUNED_ALIAS, set_experiment, flatten, mark_stale_runs,
                                      predictor_text, process_tags, register_prompt, tracking_uri)

__all__ = ["optimize_run", "log_results", "register_stage_prompt", "predictor_text"]

log = logging.getLogger(__name__)


def register_stage_prompt(stage: str, text: str, message: str, prefix: str = PROMPT_PREFIX) -> int:
    """Register ``text`` as a new version of ``<prefix>-<stage>`` unless a version already holds it
    (``eval.tracking.register_prompt``: the same names and texts an eval registers, so an eval of the tuned
    program finds this version) and point the prompt's ``@tuned`` alias at it, so ``eval --program
    prompts:/<prefix>-<stage>@tuned`` runs it. Returns the version number that holds ``text``."""
    return register_prompt(stage, text, message, prefix, tags={"source": "nemori-dspy optimize"}, alias=TUNED_ALIAS)


@contextmanager
def optimize_run(settings: NemoriSettings, params: dict[str, Any], run_name: str) -> Iterator[Any]:
    """Open the optimization's MLflow run (params logged at once) with DSPy autolog of compiles and evals.

    Yields the ``mlflow.ActiveRun``; a run left by an exception ends FAILED (MLflow's context manager).
    """
    import mlflow

    uri = tracking_uri(settings)
    mlflow.set_tracking_uri(uri)
    exp_id = set_experiment(mlflow, uri, f"{settings.mlflow_experiment}-optimize")
    for stale in mark_stale_runs(mlflow.MlflowClient(), exp_id):  # left RUNNING by a kill -9
        log.warning("MLflow run %s was left RUNNING by a process that is gone: marked KILLED", stale)
    with mlflow.start_run(run_name=run_name, tags=process_tags()) as run:
        mlflow.log_params(flatten(params))
        mlflow.log_params(flatten(settings.public_dict(), "config."))
        try:
            mlflow.dspy.autolog(log_compiles=True, log_evals=True, log_traces=False, silent=True)
        except (ImportError, AttributeError) as exc:  # an MLflow without the DSPy flavour
            log.warning("mlflow.dspy.autolog unavailable (%s); trial evaluations are not logged", exc)
        try:
            yield run
        finally:
            try:
                mlflow.dspy.autolog(disable=True)
            except (ImportError, AttributeError):
                pass


def log_results(results: list[Any], out_dir: Path, seconds: float, construction: dict[str, Any]) -> dict[str, int]:
    """Log metrics, artifacts and prompt versions of finished stages into the active run.

    Metric names: ``<stage>.{dev,test}.{before,after}`` (+ ``.low``/``.high``, ``.n``, and ``.judge``/``.f1``
    for the answer stage's parts), ``<stage>.test.diff`` (+ ``.low``/``.high``: paired after − before), ``<stage>.dev.<category>.{before,
    after}``, ``<stage>.cost.<ledger stage>.<field>``, ``seconds``. Returns ``{predictor: prompt version}``
    for the predictors whose instruction or demos the optimization changed.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    metrics: dict[str, float] = {"seconds": seconds,
                                 "construction.calls": float(sum(u.calls for u in construction.values()))}
    for r in results:
        key = r.stage.replace("+", "_")
        for split, when, score in (("dev", "before", r.before), ("dev", "after", r.after),
                                   ("test", "before", r.test_before), ("test", "after", r.test_after)):
            if score is None:
                continue
            metrics.update({f"{key}.{split}.{when}": score.mean, f"{key}.{split}.{when}.low": score.low,
                            f"{key}.{split}.{when}.high": score.high})
            metrics.update({f"{key}.{split}.{when}.{part}": sum(v) / len(v) for part, v in score.parts.items() if v})
        metrics[f"{key}.dev.n"], metrics[f"{key}.train.n"] = float(r.n_dev), float(r.n_train)
        if r.test_before is not None:
            metrics[f"{key}.test.n"] = float(r.n_test)
            paired = r.paired("test")
            if paired:
                metrics.update({f"{key}.test.diff": paired["diff"], f"{key}.test.diff.low": paired["low"],
                                f"{key}.test.diff.high": paired["high"]})
        for cat, c in r.by_category.items():
            metrics[f"{key}.dev.{cat}.before"], metrics[f"{key}.dev.{cat}.after"] = c["before"], c["after"]
        for stage, usage in r.cost.items():
            metrics.update({f"{key}.cost.{stage}.{k}": float(v) for k, v in usage.items()})
    mlflow.log_metrics(metrics)
    mlflow.log_artifacts(str(out_dir))
    versions: dict[str, int] = {}
    state = json.loads((out_dir / "program.json").read_text()) if (out_dir / "program.json").exists() else {}
    for r in results:
        for name, ch in r.changes.items():
            full = _pipeline_name(name)
            if full in state and (ch["instruction_changed"] or ch["demos"]):
                try:
                    versions[full] = register_stage_prompt(full.split(".")[1], predictor_text(state[full]),
                                                           f"tuned by optimize ({r.stage}): dev {r.before.cell()} → "
                                                           f"{r.after.cell()}")
                except MlflowException as exc:  # a backend without a prompt registry must not lose the record
                    log.warning("prompt registry unavailable (%s); the tuned program is in program.json", exc)
    if versions:
        mlflow.log_params({f"prompt_version.{k}": str(v) for k, v in versions.items()})
    return versions


def _pipeline_name(program_name: str) -> str:
    """``"narrate.predict"`` (a stage program's predictor) → ``"episodic.narrate.predict"`` (the pipeline's)."""
    from nemori_dspy.stages import PIPELINE_PATHS

    stage, _, rest = program_name.partition(".")
    return f"{PIPELINE_PATHS[stage]}.{rest}" if stage in PIPELINE_PATHS else program_name
