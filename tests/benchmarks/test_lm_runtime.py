import dspy

from benchmarks.lm_runtime import SCRIPTED, lm_overrides, lm_runtime
from nemori_dspy.config import NemoriSettings
from nemori_dspy.testing import ScriptedLM


def test_lm_overrides_select_the_model_the_switch_names():
    assert lm_overrides(SCRIPTED) == {}
    assert lm_overrides("local:1.5b") == {"model": "local", "local_model_size": "1.5b"}
    assert lm_overrides("openai/gpt-4o-mini") == {"model": "openai/gpt-4o-mini"}


def test_scripted_runtime_configures_the_scripted_lm_only_inside_the_block():
    before = dspy.settings.lm
    with lm_runtime(SCRIPTED, NemoriSettings(embedder="hashing-64")) as rt:
        assert isinstance(dspy.settings.lm, ScriptedLM) and dspy.settings.lm is not before
        assert rt.stage_lms == {} and rt.judge_lm is None and rt.model_label == SCRIPTED
    assert dspy.settings.lm is before
