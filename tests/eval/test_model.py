"""``eval.model``: the program that ran as an ``mlflow.dspy`` model (temporary sqlite MLflow store)."""

from __future__ import annotations

import json

import pytest

mlflow = pytest.importorskip("mlflow")

from nemori_dspy.config import NemoriSettings  # noqa: E402
from nemori_dspy.errors import ConfigError  # noqa: E402
from nemori_dspy.eval.model import ProgramModel, load_program, log_program_model, program_state  # noqa: E402


@pytest.fixture
def tuned():
    settings = NemoriSettings()
    state = ProgramModel(settings).dump_state()
    state["episodic.narrate.predict"]["signature"]["instructions"] += " Keep it short."
    state["response.answer.predict"]["demos"] = [{"context": "c", "question": "q", "answer": "a"}]
    return settings, state


def test_log_and_load_round_trip_by_run_and_registered_name(tmp_path, tuned, mlflow_db):
    settings, state = tuned
    uri = mlflow_db
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("m", artifact_location=(tmp_path / "art").as_uri())
    run_id = mlflow.MlflowClient().create_run(exp).info.run_id
    assert log_program_model(settings, state, run_id, register_as="nemori-test") == f"runs:/{run_id}/program"
    model = mlflow.dspy.load_model(f"runs:/{run_id}/program")
    mlflow.clear_active_model()
    assert isinstance(model, ProgramModel) and program_state(model) == state
    assert "Keep it short." in model.episodic.narrate.predict.signature.instructions
    assert load_program(f"runs:/{run_id}/program", uri) == state
    assert load_program("models:/nemori-test/1", uri) == state


def test_program_file_and_bad_references(tmp_path, tuned, mlflow_db):
    settings, state = tuned
    (tmp_path / "p.json").write_text(json.dumps(state))
    assert load_program(str(tmp_path / "p.json")) == state
    with pytest.raises(ConfigError, match="--program"):
        load_program(str(tmp_path / "missing.json"))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(ConfigError, match="runs:/<run_id>/program"):
        load_program("runs:/0123456789abcdef0123456789abcdef/program", f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(ConfigError, match="lacks predictor"):
        ProgramModel(settings, {"response.answer.predict": state["response.answer.predict"]})


def test_a_stage_prompt_overlays_only_its_stage():
    from nemori_dspy.eval.model import overlay_stage_prompt
    from nemori_dspy.eval.tracking import stage_prompts

    settings = NemoriSettings()
    base = program_state(ProgramModel(settings))
    tuned = program_state(ProgramModel(settings))
    tuned["episodic.narrate.predict"]["signature"]["instructions"] = "Narrate briefly."
    tuned["episodic.narrate.predict"]["demos"] = [{"messages": "m", "cue": "c", "narrative": "n"}]
    text = stage_prompts(ProgramModel(settings, tuned))["narrate"]
    out = overlay_stage_prompt(base, "narrate", text)
    assert out["episodic.narrate.predict"] == tuned["episodic.narrate.predict"]
    assert {k: v for k, v in out.items() if k != "episodic.narrate.predict"} == \
        {k: v for k, v in base.items() if k != "episodic.narrate.predict"}
    assert base == program_state(ProgramModel(settings))  # the input state is unchanged
    with pytest.raises(ConfigError, match="not a saved predictor text"):
        overlay_stage_prompt(base, "narrate", "Narrate briefly.")
    with pytest.raises(ConfigError, match="does not run that stage"):
        overlay_stage_prompt(base, "summarize", text)
