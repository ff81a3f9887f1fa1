"""Shared fixtures: scripted LM configured through the real ChatAdapter, store, embedder, memory, and the
LoCoMo-schema fixture conversations (paths in ``tests.fakes``)."""

from __future__ import annotations

import os

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.locomo import LoCoMoConversation, load_locomo
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.usage import UsageLedger
from tests.fakes import SYNTHETIC_MINI, ScriptedLM, default_responders, real_locomo_mini


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--live", action="store_true", help="run tests marked live (real llama.cpp server)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--live") or os.environ.get("NEMORI_LIVE") == "1":
        return
    skip = pytest.mark.skip(reason="live test: opt in with --live or NEMORI_LIVE=1")
    for item in items:
        if "live" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _memory_only_dspy_cache():
    """Tests never read or write DSPy's on-disk cache (a reply cached by one test must not leak)."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)


@pytest.fixture(autouse=True)
def ledger():
    """A fresh ``UsageLedger`` active for the whole test: every call the test makes (directly, or through any
    ``Memory``) is charged to it. Also a fresh DSPy memory cache, whatever a test changed."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    with UsageLedger().charging() as fresh:
        yield fresh


@pytest.fixture
def scripted():
    """A ScriptedLM with default responders, active (with ChatAdapter) for the test."""
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        yield lm


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(tmp_path / "m.db")
    yield s
    s.close()


@pytest.fixture
def memory(store, scripted):
    return Memory(store, HashingEmbedder(64), NemoriSettings(window_size=10))


@pytest.fixture
def synthetic_mini() -> list[LoCoMoConversation]:
    """``tests/data/synthetic_mini.json`` loaded: one conversation (``synth-1``, 56 turns, 25 QA items)."""
    return load_locomo(SYNTHETIC_MINI)


@pytest.fixture
def real_locomo_mini_path():
    """Path of the real ``locomo_mini.json`` for ``real_data`` tests; skips when it is not on this machine."""
    path = real_locomo_mini()
    if path is None:
        pytest.skip("real-data test: locomo_mini.json not found (../shared/data/locomo or $NEMORI_LOCOMO_DIR)")
    return path
