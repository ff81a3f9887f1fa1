"""Systems: ``nemori-paper`` is the paper's configuration, and a system's answer-side overrides reach its memory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nemori_dspy.apps.cli import main
from nemori_dspy.config import PAPER_FAITHFUL, NemoriSettings
from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.cache import CONSTRUCTION_FIELDS, CachedMemories, construction_key
from nemori_dspy.eval.systems import ANSWER_SIDE, PAPER_ANSWER, PAPER_CONSTRUCTION, SYSTEMS, System, parse_systems


def test_nemori_paper_carries_every_paper_value_split_into_construction_and_answer():
    paper = parse_systems("nemori-paper")[0]
    assert (paper.builds, paper.context) == ("nemori", "memory")
    assert {**paper.construction, **paper.answer} == {k: v for k, v in PAPER_FAITHFUL.items()
                                                      if k != "local_prompt_cache"}
    assert set(paper.answer) <= ANSWER_SIDE and not set(paper.construction) & ANSWER_SIDE
    assert paper.answer == PAPER_ANSWER and paper.construction == PAPER_CONSTRUCTION
    assert (paper.answer["lexical_weight"], paper.answer["answer_context_tokens"]) == (0.0, None)


def test_every_construction_override_of_nemori_paper_keys_its_store():
    """A construction setting missing from CONSTRUCTION_FIELDS would let nemori-paper reuse nemori's memory."""
    assert set(PAPER_CONSTRUCTION) <= set(CONSTRUCTION_FIELDS)
    assert not ANSWER_SIDE & set(CONSTRUCTION_FIELDS)


class _Made:
    def __init__(self, settings, path):
        self.settings, self.path = settings, path


def _provider(tmp_path: Path) -> CachedMemories:
    """CachedMemories keyed like the CLI (sha256 over the construction settings), building stand-in memories."""
    return CachedMemories(NemoriSettings(), _Made, lambda s: construction_key(s, "fake-lm", "hashing-64", "sha"),
                          tmp_path)


def test_the_memory_of_a_system_answers_with_its_answer_overrides(tmp_path):
    provider = _provider(tmp_path)
    nemori, paper = provider.memory(SYSTEMS["nemori"]), provider.memory(SYSTEMS["nemori-paper"])
    assert nemori.path != paper.path  # a different construction: its own store
    assert (paper.settings.lexical_weight, paper.settings.answer_context_tokens) == (0.0, None)
    assert (paper.settings.episode_split_gap_hours, paper.settings.resolve_relative_dates) == (None, False)
    assert nemori.settings.lexical_weight == NemoriSettings().lexical_weight


def test_an_answer_only_variant_shares_the_store_but_not_the_answer_settings(tmp_path):
    provider = _provider(tmp_path)
    variant = System("nemori-vector-only", "nemori", "memory", answer={"lexical_weight": 0.0})
    base, other = provider.memory(SYSTEMS["nemori"]), provider.memory(variant)
    assert base.path == other.path and variant.construction_key() == SYSTEMS["nemori"].construction_key()
    assert (base.settings.lexical_weight, other.settings.lexical_weight) == (NemoriSettings().lexical_weight, 0.0)
    assert provider.memory(variant) is other


def test_nemori_paper_is_named_in_the_system_help(capsys):
    assert main(["eval", "locomo", "--help"]) == 0
    help_text = re.sub(r"-\s+", "-", capsys.readouterr().out)  # the help wraps lines at hyphens
    assert "nemori-paper" in help_text and "--slice" in help_text


def test_an_unknown_system_lists_nemori_paper():
    with pytest.raises(ConfigError, match="nemori-paper"):
        parse_systems("nemori-papr")
