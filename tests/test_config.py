"""Settings: validators reject bad values with a message naming the field and where it came from, off words and
per-embedder defaults resolve, secrets stay out of the logged config, and the paper's configuration is complete."""

from __future__ import annotations

import pytest

import nemori_dspy.config as config
from nemori_dspy.config import NOT_IN_PAPER, PAPER_FAITHFUL, NemoriSettings, load_settings
from nemori_dspy.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch, tmp_path):
    """No NEMORI_* variable or .env file of the machine reaches these settings."""
    import os

    for name in [n for n in os.environ if n.startswith("NEMORI_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("overrides, field", [
    ({"naive_timezone": "Mars/Olympus"}, "naive_timezone"),
    ({"judge_model": "local:7b"}, "judge_model"),
    ({"stage_lms": {"narate": {"max_tokens": 7}}}, "stage_lms"),
    ({"stage_lms": {"narrate": {"model": "local:7b"}}}, "stage_lms.narrate.model"),
    ({"stage_lms": {"narrate": {"max_tokens": 0}}}, "stage_lms.narrate.max_tokens"),
    ({"predictor_classes": {"answr": "dspy.ChainOfThought"}}, "predictor_classes"),
    ({"window_size": 0}, "window_size"),
    ({"distillation": "sometimes"}, "distillation"),
])
def test_a_bad_value_is_refused_with_the_field_and_its_flag(overrides, field):
    with pytest.raises(ConfigError) as err:
        load_settings(**overrides)
    top = field.split(".")[0]
    assert f"{field} (given as --{top.replace('_', '-')}" in str(err.value)


def test_a_value_missing_for_another_one_names_the_variable_to_set():
    with pytest.raises(ConfigError) as err:
        load_settings(store="weaviate")
    assert "weaviate_url (env NEMORI_WEAVIATE_URL)" in str(err.value)
    assert load_settings(store="weaviate", weaviate_url="http://localhost:8080").weaviate_url


def test_a_bad_environment_value_names_its_variable(monkeypatch):
    monkeypatch.setenv("NEMORI_WINDOW_SIZE", "many")
    with pytest.raises(ConfigError, match="NEMORI_WINDOW_SIZE"):
        load_settings()
    monkeypatch.setenv("NEMORI_WINDOW_SIZE", "7")
    assert load_settings().window_size == 7


@pytest.mark.parametrize("word", ["off", "none", "null", "", " OFF "])
def test_off_words_switch_a_guard_off(word):
    s = NemoriSettings(episode_split_gap_hours=word, association_min_similarity=word,
                       consolidation_min_similarity=word, answer_context_tokens=word, partition_message_chars=word)
    assert (s.episode_split_gap_hours, s.association_min_similarity, s.consolidation_min_similarity,
            s.answer_context_tokens, s.partition_message_chars) == (None,) * 5


@pytest.mark.parametrize("word", ["none", "null", "", " None "])
def test_an_empty_judge_model_is_the_main_model(word):
    assert NemoriSettings(judge_model=word).judge_model is None


def test_an_unset_evoke_threshold_is_the_embedders_and_a_set_one_is_kept():
    assert NemoriSettings(embedder="all-MiniLM-L6-v2").evoke_threshold == config.EVOKE_THRESHOLDS["all-MiniLM-L6-v2"]
    assert NemoriSettings(embedder="some/other-model").evoke_threshold == config.PAPER_EVOKE_THRESHOLD
    assert NemoriSettings(embedder="all-MiniLM-L6-v2", evoke_threshold=0.9).evoke_threshold == 0.9


def test_a_stage_cap_is_its_override_else_its_default_within_the_global_cap():
    assert NemoriSettings(stage_lms={"narrate": {"max_tokens": 999}}).stage_max_tokens("narrate") == 999
    assert NemoriSettings(max_tokens=4096).stage_max_tokens("narrate") == config.DEFAULT_STAGE_MAX_TOKENS["narrate"]
    assert NemoriSettings(max_tokens=30).stage_max_tokens("narrate") == 30
    assert NemoriSettings(max_tokens=4096).stage_max_tokens("reflection") == 4096  # not a stage: the global cap


def test_the_logged_config_has_no_secret():
    d = NemoriSettings(api_key="sk-secret", api_token="tok-secret").public_dict()
    assert "sk-secret" not in str(d) and "tok-secret" not in str(d)
    assert d["api_key_set"] is True and d["api_token_set"] is True and "api_key" not in d


# --- the paper's configuration: every setting has its paper value or is not in the paper


def test_every_setting_records_its_paper_value_or_says_the_paper_has_none():
    """A new setting fails here until PAPER_FAITHFUL holds the paper's value of it (or NOT_IN_PAPER lists it)."""
    fields = set(NemoriSettings.model_fields)
    unrecorded = fields - set(PAPER_FAITHFUL) - NOT_IN_PAPER
    assert not unrecorded, f"record the paper's value of {sorted(unrecorded)} in config.PAPER_FAITHFUL"
    assert not set(PAPER_FAITHFUL) & NOT_IN_PAPER
    assert not (set(PAPER_FAITHFUL) | NOT_IN_PAPER) - fields, "names of settings that do not exist"


def test_every_default_that_differs_from_the_paper_is_undone_by_paper_faithful():
    default, paper = NemoriSettings(), NemoriSettings(**PAPER_FAITHFUL)
    differ = {f for f in PAPER_FAITHFUL if getattr(default, f) != PAPER_FAITHFUL[f]}
    assert {f: getattr(paper, f) for f in PAPER_FAITHFUL} == PAPER_FAITHFUL
    # the additions the issue names are among them, switched off
    assert {"episode_split_gap_hours", "lexical_weight", "resolve_relative_dates", "answer_context_tokens",
            "consolidation_min_similarity", "association_min_similarity", "hold_open_segment"} <= differ
    assert (paper.episode_split_gap_hours, paper.association_max_gap_hours, paper.lexical_weight,
            paper.resolve_relative_dates, paper.association_min_similarity) == (None, None, 0.0, False, None)


def test_every_setting_described_as_our_addition_records_the_paper_value():
    ours = {name for name, f in NemoriSettings.model_fields.items()
            if (f.description or "").startswith("our addition")}
    assert ours and ours <= set(PAPER_FAITHFUL)
    # an addition is on by default unless its description says its default is the paper's behaviour
    default = NemoriSettings()
    on = {f for f in ours if getattr(default, f) != PAPER_FAITHFUL[f]}
    assert on == ours - {"association_max_gap_hours"}  # described as off by default


def test_every_method_setting_is_described():
    missing = [name for name, f in NemoriSettings.model_fields.items() if name in PAPER_FAITHFUL and not f.description]
    assert not missing


def test_the_guards_default_to_their_measured_floors_and_read_off_words():
    s = NemoriSettings()
    assert (s.association_max_gap_hours, s.association_min_similarity, s.consolidation_min_similarity) == \
        (None, config.ASSOCIATION_MIN_SIMILARITY, config.CONSOLIDATION_MIN_SIMILARITY)
    assert NemoriSettings(association_min_similarity="off").association_min_similarity is None


def test_the_paper_configuration_is_valid_and_runs_the_papers_method():
    paper = NemoriSettings(**PAPER_FAITHFUL)
    assert (paper.window_size, paper.distillation, paper.consolidation, paper.semantic_management) == \
        (20, "prediction_error", True, "structured")
    assert (paper.association_top_k, paper.consolidation_top_k, paper.episodes_top_k, paper.semantic_top_k) == \
        (5, 5, 10, 20)
