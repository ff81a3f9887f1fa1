"""Settings module: its documentation names functions that exist."""

from __future__ import annotations

import importlib
import re

import nemori_dspy.config as config


def test_every_function_the_config_docstring_names_exists():
    named = re.findall(r"``(nemori_dspy(?:\.\w+)+)``", config.__doc__ or "")
    assert named, "the docstring names the entry point that consumes the settings"
    for dotted in named:
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted


# --- the paper's configuration (issue 19 item 7): every setting has its paper value or is not in the paper
from nemori_dspy.config import NOT_IN_PAPER, PAPER_FAITHFUL, NemoriSettings  # noqa: E402


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
    assert on == ours - {"association_max_gap_hours"}


def test_every_method_setting_is_described():
    missing = [name for name, f in NemoriSettings.model_fields.items() if name in PAPER_FAITHFUL and not f.description]
    assert not missing


def test_the_guards_default_to_their_measured_floors_and_read_off_words():
    s = NemoriSettings()
    assert (s.association_max_gap_hours, s.association_min_similarity, s.consolidation_min_similarity) == \
        (None, config.ASSOCIATION_MIN_SIMILARITY, config.CONSOLIDATION_MIN_SIMILARITY)
    assert NemoriSettings(association_min_similarity="off").association_min_similarity is None
