"""construction_key: what shapes memory changes the key, answer-side changes and unchanged programs do not."""

import json

import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.eval.cache import construction_key
from nemori_dspy.modules.pipeline import NemoriPipeline, stage_factory
from nemori_dspy.modules.resources import Resources


def _saved_program(tmp_path, settings, edit=None):
    pipeline = NemoriPipeline(Resources(None, None, settings), stage_factory(settings, {}))
    if edit:
        edit(pipeline)
    path = tmp_path / "program.json"
    pipeline.save(str(path))
    return json.loads(path.read_text())


def _key(settings, program=None):
    return construction_key(settings, "local:model.gguf", "hashing-64", "abc123", program)


def test_unchanged_saved_program_reuses_the_untuned_memory(tmp_path):
    settings = NemoriSettings()
    program = _saved_program(tmp_path, settings)
    assert "metadata" in program  # dependency versions are saved, but must not key memory
    assert _key(settings, program) == _key(settings)


def test_answer_only_tuning_reuses_memory(tmp_path):
    settings = NemoriSettings()

    def tune_answer(p):
        p.response.answer.predict.signature = p.response.answer.predict.signature.with_instructions("Be terse.")

    assert _key(settings, _saved_program(tmp_path, settings, tune_answer)) == _key(settings)


def test_tuned_construction_predictor_changes_the_key(tmp_path):
    settings = NemoriSettings()

    def tune_narrate(p):
        p.episodic.narrate.predict.signature = p.episodic.narrate.predict.signature.with_instructions("Be vivid.")

    assert _key(settings, _saved_program(tmp_path, settings, tune_narrate)) != _key(settings)


def test_construction_settings_change_the_key_answer_settings_do_not():
    base = NemoriSettings()
    assert _key(base.model_copy(update={"window_size": 10})) != _key(base)
    assert _key(base.model_copy(update={"episodes_top_k": 3})) == _key(base)


def test_consolidation_floor_and_naive_timezone_change_the_key():
    base = NemoriSettings()
    assert _key(base.model_copy(update={"consolidation_min_similarity": None})) != _key(base)
    assert _key(base.model_copy(update={"naive_timezone": "Asia/Shanghai"})) != _key(base)


@pytest.mark.parametrize("change", [{"consolidation_mode": "batched"}, {"narration_mode": "batched"},
                                    {"partition_min_messages": 2}, {"select_inputs": "cues"},
                                    {"semantic_management": "flat"}, {"evoke_threshold": 0.7}])
def test_every_construction_switch_is_in_the_memory_key(change):
    assert construction_key(NemoriSettings(**change), "m", "e", "d") != construction_key(NemoriSettings(), "m", "e", "d")


@pytest.mark.parametrize("change", [{"answer_context_tokens": 2000}, {"lexical_weight": 0.0}, {"episodes_top_k": 5}])
def test_answer_side_settings_reuse_the_memory(change):
    assert construction_key(NemoriSettings(**change), "m", "e", "d") == construction_key(NemoriSettings(), "m", "e", "d")
