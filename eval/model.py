"""The pipeline state that ran, as an MLflow model (``mlflow.dspy`` flavour).

A ``NemoriPipeline`` holds a store and an embedder, which are no part of a program and cannot be saved as a
model. ``ProgramModel`` holds only the pipeline's predictors, built by the same ``stage_factory`` and named as
in the pipeline (``episodic.narrate.predict``, ``response.answer.predict`` ...), so its ``dump_state()`` is the
pipeline's ``program.json`` (without ``metadata``) and ``load_program`` / ``eval --program`` accept it.

* ``log_program_model``: ``mlflow.dspy.log_model(ProgramModel, name="program", use_dspy_model_save=True)`` into
  a run, optionally registered under a model name (``--register-model NAME``).
* ``load_program``: a program reference → saved pipeline state: a ``program.json`` path, ``runs:/<run_id>/program``
  or ``models:/<name>/<version>`` (loaded with ``mlflow.dspy.load_model``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.errors import ConfigError

__all__ = ["ProgramModel", "log_program_model", "load_program", "apply_program", "program_state", "is_model_uri",
           "is_prompt_uri", "overlay_stage_prompt", "MODEL_NAME"]

log = logging.getLogger(__name__)

#: artifact name of the logged program model inside an eval's parent run (``runs:/<run_id>/program``).
MODEL_NAME = "program"
_MODEL_SCHEMES = ("runs:/", "models:/")
_PROMPT_SCHEME = "prompts:/"


class _Part(dspy.Module):
    """A named container (``episodic``, ``semantic``, ``response``) of stage predictors."""


class ProgramModel(dspy.Module):
    """The pipeline's predictors without store or embedder: ``forward(context, question) -> Prediction(answer)``
    runs the answer stage; the construction stages are carried for their state (instructions, demos).

    Args:
        settings: decides each stage's predictor class and output cap, as for the pipeline.
        state: a saved pipeline state (``program.json``); ``None`` → the code's default prompts.
    Raises:
        ConfigError: ``state`` names a predictor this pipeline does not have.
    """

    def __init__(self, settings: NemoriSettings, state: dict[str, Any] | None = None) -> None:
        super().__init__()
        from nemori_dspy.modules.pipeline import stage_factory
        from nemori_dspy.stages import PIPELINE_PATHS

        make, runs = stage_factory(settings, {}), _stages_run(settings)
        for stage, path in PIPELINE_PATHS.items():
            if stage not in runs:
                continue
            part_name, attr = path.split(".")
            if not hasattr(self, part_name):
                setattr(self, part_name, _Part())
            setattr(getattr(self, part_name), attr, make(stage))
        if state:
            apply_program(self, state)

    def forward(self, context: str, question: str) -> dspy.Prediction:
        return self.response.answer(context=context, question=question)


def _stages_run(settings: NemoriSettings) -> set[str]:
    """The stages a pipeline built from ``settings`` runs (e.g. no ``direct_distill`` under prediction error,
    ``summarize`` only under flat management): the predictors its ``program.json`` holds."""
    from nemori_dspy.modules.pipeline import NemoriPipeline, pipeline_stage, stage_factory
    from nemori_dspy.modules.resources import Resources
    from nemori_dspy.stages import PIPELINE_PATHS

    fresh = NemoriPipeline(Resources(None, None, settings), stage_factory(settings, {}))  # type: ignore[arg-type]
    out = set()
    for stage in PIPELINE_PATHS:
        try:
            pipeline_stage(fresh, stage)
        except ConfigError:
            continue
        out.add(stage)
    return out


def apply_program(module: dspy.Module, state: dict[str, Any]) -> dspy.Module:
    """Load a saved pipeline state into ``module``'s predictors (in place); each keeps its own LM (the
    runtime's stage LMs, from settings), so a saved ``lm`` entry is ignored and ``metadata`` is skipped.

    Raises:
        ConfigError: ``state`` lacks one of ``module``'s predictors or does not fit it.
    """
    mine = dict(module.named_predictors())
    missing = sorted(set(mine) - set(state))
    if missing:
        raise ConfigError(f"saved program lacks predictor(s) {', '.join(missing)}. Fix: pass a program saved from "
                          "this pipeline (eval's program.json, optimize's program.json, or its MLflow model).")
    for name, predictor in mine.items():
        lm = predictor.lm
        try:
            predictor.load_state({**state[name], "lm": None})
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"saved program: predictor {name!r} does not fit ({exc}). Fix: pass a program "
                              "saved from a pipeline with the same predictor classes.") from exc
        predictor.lm = lm
    return module


def program_state(module: dspy.Module) -> dict[str, Any]:
    """``module.dump_state()`` (JSON mode) with each predictor's ``lm`` left out: what a program is."""
    return {name: {**state, "lm": None} for name, state in module.dump_state().items()}


def log_program_model(settings: NemoriSettings, state: dict[str, Any], run_id: str,
                      register_as: str | None = None) -> str:
    """Log ``state`` as an ``mlflow.dspy`` model named :data:`MODEL_NAME` into run ``run_id``.

    ``register_as``: also register it under this model name (a new version per call).
    Returns the model URI ``runs:/<run_id>/program``. The model is saved with DSPy's own save
    (``use_dspy_model_save=True``) and explicit pip requirements (no requirement inference subprocess).
    """
    import mlflow

    model = ProgramModel(settings, state)
    with dspy.context(lm=None, adapter=None, callbacks=[]):  # the saved dspy settings hold no live LM
        with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
            mlflow.dspy.log_model(model, name=MODEL_NAME, use_dspy_model_save=True,
                                  pip_requirements=[f"dspy=={dspy.__version__}", f"mlflow=={mlflow.__version__}",
                                                    "nemori-dspy"],
                                  registered_model_name=register_as)
    return f"runs:/{run_id}/{MODEL_NAME}"


def is_model_uri(ref: str) -> bool:
    """True for ``runs:/...`` and ``models:/...`` program references."""
    return ref.startswith(_MODEL_SCHEMES)


def is_prompt_uri(ref: str) -> bool:
    """True for ``prompts:/<name>@<alias>`` / ``prompts:/<name>/<version>`` references (one stage's prompt)."""
    return ref.startswith(_PROMPT_SCHEME)


def overlay_stage_prompt(state: dict[str, Any], stage: str, text: str) -> dict[str, Any]:
    """``state`` (a saved pipeline state) with stage ``stage``'s predictor(s) taking the instruction, fields and demos
    of ``text``: a registered stage prompt (``eval.tracking.stage_prompts``: one predictor's ``predictor_text``, or a
    JSON map ``{sub-path: predictor_text}`` for a stage with several). Returns a new state; ``state`` is unchanged.

    Raises:
        ConfigError: ``state`` has no predictor of ``stage``, or ``text`` is not a stage prompt that fits it.
    """
    from nemori_dspy.stages import PIPELINE_PATHS

    path = PIPELINE_PATHS[stage]
    mine = {k[len(path) + 1:]: k for k in state if k.startswith(path + ".")}
    fix = "Fix: load a prompt that an eval or optimize of this pipeline registered (nemori-dspy-<stage>)."
    if not mine:
        raise ConfigError(f"stage prompt for {stage!r}: this pipeline does not run that stage. {fix}")
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ConfigError(f"stage prompt for {stage!r} is not a saved predictor text (JSON). {fix}") from None
    parts = {next(iter(mine)): parsed} if len(mine) == 1 else \
        {sub: json.loads(t) if isinstance(t, str) else t for sub, t in parsed.items()}
    out = {k: dict(v) for k, v in state.items()}
    for sub, part in parts.items():
        if sub not in mine or not isinstance(part, dict) or "instructions" not in part:
            raise ConfigError(f"stage prompt for {stage!r}: part {sub!r} does not fit predictors "
                              f"{', '.join(sorted(mine))}. {fix}")
        name = mine[sub]
        signature = dict(out[name].get("signature") or {})
        signature["instructions"] = part["instructions"]
        if part.get("fields"):
            signature["fields"] = part["fields"]
        out[name]["signature"], out[name]["demos"] = signature, list(part.get("demos") or [])
    return out


def load_program(ref: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """A program reference → saved pipeline state ``{predictor name: state}``.

    ``ref``: a ``program.json`` path, ``runs:/<run_id>/program`` or ``models:/<name>/<version>``.
    ``tracking_uri``: the MLflow store a model URI lives in (default: MLflow's current one).
    Raises:
        ConfigError: the file or model cannot be read.
    """
    if not is_model_uri(ref):
        try:
            return json.loads(Path(ref).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--program {ref}: cannot read a saved pipeline state ({exc}). Fix: pass a file "
                              "written by NemoriPipeline.save(path), or runs:/<run_id>/program, or "
                              "models:/<name>/<version>.") from exc
    import mlflow
    from mlflow.exceptions import MlflowException

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    before = dict(dspy.settings.config)
    try:
        model = mlflow.dspy.load_model(ref)
    except (MlflowException, OSError) as exc:
        raise ConfigError(f"--program {ref}: cannot load the MLflow model ({str(exc).splitlines()[0][:200]}). Fix: "
                          "copy the run id from the eval's 'MLflow run …' line (runs:/<run_id>/program) or use "
                          "models:/<name>/<version> of a --register-model name; pass --mlflow-tracking-uri if "
                          "the run is in another store.") from None
    finally:  # load_model configures dspy from the saved settings and makes the model MLflow's active one:
        dspy.settings.configure(**{k: before.get(k) for k in ("lm", "adapter", "callbacks")})  # keep our own
        mlflow.clear_active_model()  # else this eval's metrics and traces would be filed under the loaded model
    return program_state(model)
