"""Flat summarization management (Appendix A.1): one running summary per user, rewritten by P_sum."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.cache import construction_key
from nemori_dspy.eval.systems import parse_systems
from nemori_dspy.memory import Memory
from nemori_dspy.modules.flat import fallback_summary, summary_id
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, chat_reply, default_responders

T0 = datetime(2023, 5, 7, 13, 0)


def _messages(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"d{i}", "speaker": "Alice" if i % 2 == 0 else "Bob",
             "content": f"Alice talks about hobby number {i}", "timestamp": (T0 + timedelta(hours=30 * i)).isoformat()}
            for i in range(start, start + n)]


def _memory(tmp_path: Path, **kw) -> Memory:
    settings = NemoriSettings(window_size=4, semantic_management="flat", **kw)
    return Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)


def test_semantic_memory_is_one_summary_holding_every_insight(tmp_path):
    lm = ScriptedLM(default_responders(groups_of=2))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = _memory(tmp_path)
        mem.add_messages("alice", _messages(8))
        mem.flush("alice")
    entries = mem.list_semantic("alice")
    assert [e.id for e in entries] == [summary_id("alice")]
    for i in range(8):  # the scripted distiller returns every message line as an insight
        assert f"hobby number {i}" in entries[0].text
    assert len(entries[0].source_episode_ids) == len(mem.list_episodes("alice"))


def test_the_summary_is_the_constant_evoked_context(tmp_path):
    lm = ScriptedLM(default_responders(groups_of=2))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = _memory(tmp_path)
        mem.add_messages("alice", _messages(4))
        mem.flush("alice")
    anticipations = [inp["known_facts"] for name, inp in lm.prompts if name == "AnticipateEpisode"]
    assert "hobby number" not in anticipations[0]  # nothing known yet
    assert "hobby number 0" in anticipations[-1]  # later episodes are predicted from the summary
    assert [name for name, _ in lm.prompts].count("UpdateSummary") == len(mem.list_episodes("alice"))
    assert "ConsolidateKnowledge" not in [name for name, _ in lm.prompts]


def test_a_reply_that_drops_the_summary_keeps_it(tmp_path):
    responders = default_responders(groups_of=2)
    good = responders["UpdateSummary"]
    calls = []

    def forgetful(i):
        calls.append(i)
        return good(i) if len(calls) == 1 else chat_reply(updated_summary="Nothing.")

    responders["UpdateSummary"] = forgetful
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        mem = _memory(tmp_path)
        mem.add_messages("alice", _messages(4))
        mem.flush("alice")
    text = mem.list_semantic("alice")[0].text
    assert "hobby number 0" in text and "hobby number 3" in text and "Nothing." not in text


def test_fallback_appends_insights_line_by_line():
    assert fallback_summary("Alice hikes.", ["Bob swims.", "Alice moved."]) == "Alice hikes.\nBob swims.\nAlice moved."
    assert fallback_summary("", ["Bob swims."]) == "Bob swims."


def test_summary_is_cut_to_its_cap(tmp_path):
    with dspy.context(lm=ScriptedLM(default_responders(groups_of=2)), adapter=dspy.ChatAdapter()):
        mem = _memory(tmp_path, summary_max_chars=60)
        mem.add_messages("alice", _messages(8))
        mem.flush("alice")
    assert len(mem.list_semantic("alice")[0].text) <= 60


def test_only_the_flat_predictors_are_in_the_program(tmp_path):
    mem = _memory(tmp_path)
    names = {n for n, _ in mem.pipeline.named_predictors()}
    assert {"semantic.summarize.predict", "semantic.anticipate.predict", "semantic.distill.predict"} <= names
    assert not any(n.startswith("semantic.consolidate") for n in names)


def test_nemori_flat_system_builds_its_own_memory_and_keeps_structured_keys():
    (flat,) = parse_systems("nemori-flat")
    (nemori,) = parse_systems("nemori")
    assert flat.construction_key() != nemori.construction_key()
    structured = NemoriSettings()
    assert construction_key(structured, "m", "e", "d") == construction_key(
        NemoriSettings(semantic_management="structured"), "m", "e", "d")
    assert construction_key(NemoriSettings(semantic_management="flat"), "m", "e", "d") != construction_key(
        structured, "m", "e", "d")


@pytest.mark.parametrize("bad", ["tree", ""])
def test_unknown_management_is_refused(bad):
    with pytest.raises(ValueError, match="semantic_management"):
        NemoriSettings(semantic_management=bad)
