"""``--slice memory``: a named LoCoMo slice where memory matters (issue 19 item 4)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from nemori_dspy.apps.cli.evaluate import named_slice_ids
from nemori_dspy.apps.cli.optimize import optimize, optimize_command
from nemori_dspy.errors import DatasetError
from nemori_dspy.eval.locomo import NAMED_SLICES, SCORED_CATEGORIES, load_locomo, named_slice, session_of, slice_sessions

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "locomo10.json"


def test_the_memory_slice_is_one_whole_conversation():
    assert named_slice("memory") == (["conv-49"], None)
    assert named_slice(" Memory ") == named_slice("memory")


def test_an_unknown_slice_names_the_known_ones():
    with pytest.raises(DatasetError, match="memory"):
        named_slice("tiny")


def test_slice_replaces_conversations_and_sessions_and_refuses_both():
    assert named_slice_ids("memory", None, None) == (["conv-49"], None)
    with pytest.raises(DatasetError, match="--conversations"):
        named_slice_ids("memory", "conv-26", None)


def test_optimize_takes_a_slice_without_train_and_dev():
    flags = optimize.make_context("optimize", ["--stage", "answer", "--slice", "memory"]).params
    assert (flags["slice_name"], flags["train"], flags["dev"]) == ("memory", None, None)


@pytest.mark.skipif(not LOCOMO.is_file(), reason="locomo10.json (CC BY-NC) is not beside the checkout")
def test_the_memory_slice_has_what_the_issue_asks_for():
    """>= 25 sessions per conversation, >= 100 scored questions in all four categories, ~500 turns (~90 min)."""
    ids, sessions = named_slice("memory")
    convs = [slice_sessions(c, sessions) for c in load_locomo(LOCOMO, ids)]
    per_cat = collections.Counter(q.category for c in convs for q in c.questions if q.category in SCORED_CATEGORIES)
    assert all(len({session_of(m.id) for m in c.messages}) >= 25 for c in convs)
    assert sum(per_cat.values()) == 156 and set(per_cat) == set(SCORED_CATEGORIES)
    assert sum(len(c.messages) for c in convs) == 509
    assert "509 turns" in NAMED_SLICES["memory"][2]


def test_optimize_on_the_one_conversation_slice_asks_for_train_conversations():
    from nemori_dspy.errors import ConfigError
    flags = optimize.make_context("optimize", ["--stage", "answer", "--slice", "memory"]).params
    with pytest.raises(ConfigError, match="--train"):
        optimize_command(flags)
