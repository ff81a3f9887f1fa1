"""Semantic distillation: τ on cosine for evocation, consolidation new/merge/conflict applied to the store."""

from __future__ import annotations

from datetime import datetime

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.modules.pipeline import stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.modules.semantic import SemanticDistillation
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, SemanticEntry, StoredMessage
from nemori_dspy.usage import LEDGER
from tests.fakes import ScriptedLM, TableEmbedder, chat_reply, default_responders, unit_vector


def _episode(vec) -> Episode:
    ts = datetime(2023, 5, 8, 13, 0)
    msg = StoredMessage(user_id="u", id="D1:1", seq=1, speaker="Caroline", content="I adopted a dog named Rex.",
                        timestamp=ts)
    return Episode(id="ep_new", user_id="u", cue="Caroline adopts Rex", narrative="Caroline adopted a dog.",
                   message_ids=["D1:1"], messages=[msg], start=ts, end=ts, vector=vec)


def _seed(store, entries: dict[str, list[float]]):
    store.check_embedder("table-3", 3)
    rows = [SemanticEntry(id=f"s{i}", user_id="u", text=t, vector=v) for i, (t, v) in enumerate(entries.items())]
    store.commit_distillation("u", "ep_seed", rows, [])
    return rows


def _module(store, embedder, responders, **settings):
    s = NemoriSettings(**settings)
    return SemanticDistillation(Resources(store, embedder, s), stage_factory(s))


def test_evocation_keeps_only_entries_with_cosine_above_tau(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    # cosines to the episode vector (x axis): cos 30° = 0.866, cos 44° = 0.719, cos 46° = 0.695, cos 80° = 0.174
    _seed(store, {"close": unit_vector(30), "just above": unit_vector(44), "just below": unit_vector(46), "far": unit_vector(80)})
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None)(user_id="u", episode=_episode(unit_vector(0)))
    assert pred.evoked == ["close", "just above"]
    anticipate = [inp for name, inp in lm.prompts if name == "AnticipateEpisode"][0]
    assert "just above" in anticipate["known_facts"] and "just below" not in anticipate["known_facts"]


def test_empty_evoked_context_is_counted(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder({}), None)(user_id="u", episode=_episode(unit_vector(0)))
    assert LEDGER.counters["evoke_empty"] == 1 and LEDGER.counters["evoke_calls"] == 1


def _consolidate(tmp_path, reply: str, insight="Caroline adopted a dog named Rex in May 2023."):
    store = SQLiteStore(tmp_path / "m.db")
    old = _seed(store, {"Caroline likes dogs.": unit_vector(10), "Caroline has no pets.": unit_vector(20),
                        "Melanie paints.": unit_vector(90)})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[insight])
    responders["ConsolidateKnowledge"] = lambda i: reply
    emb = TableEmbedder({insight: unit_vector(5), "Caroline loves dogs and adopted Rex in May 2023.": unit_vector(8)})
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        pred = _module(store, emb, None)(user_id="u", episode=_episode(unit_vector(0)))
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    return store, old, {e.text: e for e in store.list_semantic("u")}


def test_consolidation_new_inserts(tmp_path):
    _, _, live = _consolidate(tmp_path, chat_reply(action="new", targets=[], merged_text=""))
    assert set(live) == {"Caroline likes dogs.", "Caroline has no pets.", "Melanie paints.",
                         "Caroline adopted a dog named Rex in May 2023."}
    assert live["Caroline adopted a dog named Rex in May 2023."].source_episode_ids == ["ep_new"]


def test_consolidation_merge_replaces_targets_with_merged_text(tmp_path):
    # candidates are ranked by cosine to the insight (5°): [1] likes dogs (10°), [2] no pets (20°), [3] paints
    store, old, live = _consolidate(tmp_path, chat_reply(
        action="merge", targets=[1], merged_text="Caroline loves dogs and adopted Rex in May 2023."))
    assert "Caroline likes dogs." not in live
    merged = live["Caroline loves dogs and adopted Rex in May 2023."]
    assert merged.supersedes == ["s0"] and "ep_new" in merged.source_episode_ids
    assert "Caroline has no pets." in live and "Melanie paints." in live


def test_consolidation_conflict_deletes_targets_and_inserts_insight(tmp_path):
    _, _, live = _consolidate(tmp_path, chat_reply(action="conflict", targets=[2], merged_text=""))
    assert "Caroline has no pets." not in live
    assert live["Caroline adopted a dog named Rex in May 2023."].supersedes == ["s1"]
    assert "Caroline likes dogs." in live


def test_action_followed_by_an_echoed_format_note_is_repaired_without_a_retry(tmp_path):
    """Seen with the 0.5B model: the action word followed by the adapter's format note. The leading
    keyword is kept (pydantic BeforeValidator on ``ConsolidationAction``); no retry, conflict applied."""
    echo = "conflict        # note: the value you produce must exactly match (no extra characters) one of: new"
    store, _, live = _consolidate(tmp_path, chat_reply(action=echo, targets=[2], merged_text=""))
    assert "Caroline has no pets." not in live
    assert live["Caroline adopted a dog named Rex in May 2023."].supersedes == ["s1"]


@pytest.mark.parametrize("reply", [
    chat_reply(action="merge", targets=[7], merged_text="x"),      # target out of range
    chat_reply(action="conflict", targets=[], merged_text=""),     # conflict without targets
    chat_reply(action="merge", targets=[1], merged_text=""),       # merge without text
])
def test_unusable_directive_falls_back_to_new_and_deletes_nothing(tmp_path, reply):
    _, _, live = _consolidate(tmp_path, reply)
    assert len(live) == 4 and "Caroline adopted a dog named Rex in May 2023." in live


def test_management_off_appends_without_consolidation_calls(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, {"Caroline likes dogs.": unit_vector(10)})
    lm = ScriptedLM(default_responders())
    s = NemoriSettings(consolidation=False)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = SemanticDistillation(Resources(store, TableEmbedder({}), s), stage_factory(s))(
            user_id="u", episode=_episode(unit_vector(0)))
    assert pred.inserts and not pred.deletes and "ConsolidateKnowledge" not in lm.calls


def test_direct_distillation_skips_prediction(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    lm = ScriptedLM(default_responders())
    s = NemoriSettings(distillation="direct")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        SemanticDistillation(Resources(store, TableEmbedder({}), s), stage_factory(s))(
            user_id="u", episode=_episode(unit_vector(0)))
    assert "DistillDirect" in lm.calls and "AnticipateEpisode" not in lm.calls
