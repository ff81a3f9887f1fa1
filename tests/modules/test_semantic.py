"""Semantic distillation: τ on cosine for evocation, consolidation new/merge/conflict applied to the store."""

from __future__ import annotations

from datetime import datetime

import dspy
import numpy as np
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.modules.pipeline import stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.modules.semantic import SemanticDistillation
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, SemanticEntry, StoredMessage
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
        pred = _module(store, TableEmbedder({}), None, evoke_threshold=0.70)(user_id="u", episode=_episode(unit_vector(0)))
    assert pred.evoked == ["close", "just above"]
    anticipate = [inp for name, inp in lm.prompts if name == "AnticipateEpisode"][0]
    assert "just above" in anticipate["known_facts"] and "just below" not in anticipate["known_facts"]


def test_empty_evoked_context_is_counted(tmp_path, ledger):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder({}), None)(user_id="u", episode=_episode(unit_vector(0)))
    assert ledger.counters["evoke_empty"] == 1 and ledger.counters["evoke_calls"] == 1


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


def test_consolidation_records_the_decision_that_retired_each_entry(tmp_path):
    store, _, live = _consolidate(tmp_path / "merge", chat_reply(
        action="merge", targets=[1], merged_text="Caroline loves dogs and adopted Rex in May 2023."))
    merged = live["Caroline loves dogs and adopted Rex in May 2023."]
    (old,) = store.semantic_versions("u", ["s0"])
    assert merged.origin == "merge" and (old.live, old.retired_by, old.retired_decision) == (False, merged.id, "merge")
    assert live["Caroline has no pets."].origin is None                  # seeded without a decision
    store, _, live = _consolidate(tmp_path / "conflict", chat_reply(action="conflict", targets=[2], merged_text=""))
    new = live["Caroline adopted a dog named Rex in May 2023."]
    (old,) = store.semantic_versions("u", ["s1"])
    assert new.origin == "conflict" and (old.retired_by, old.retired_decision) == (new.id, "conflict")
    _, _, live = _consolidate(tmp_path / "new", chat_reply(action="new", targets=[], merged_text=""))
    assert live["Caroline adopted a dog named Rex in May 2023."].origin == "new"


def test_an_entry_made_and_retired_within_one_episode_hands_on_what_it_replaced(tmp_path):
    from nemori_dspy.modules.semantic import Consolidation, _retire

    stored = SemanticEntry(id="s0", user_id="u", text="Caroline likes dogs.", vector=unit_vector(10))
    store = SQLiteStore(tmp_path / "m.db")
    store.commit_distillation("u", "ep_seed", [stored], [])
    plan = Consolidation(stored={"s0": "caroline likes dogs"}, entries={"s0": stored})
    first = SemanticEntry(id="m1", user_id="u", text="Caroline loves dogs.", vector=unit_vector(10), supersedes=["s0"],
                          origin="merge")
    _retire(plan, [stored], first, "merge")
    plan.inserts.append(first)
    second = SemanticEntry(id="m2", user_id="u", text="Caroline fears dogs.", vector=unit_vector(10),
                           supersedes=["m1"], origin="conflict")
    _retire(plan, [first], second, "conflict")                            # m1 is never stored
    plan.inserts.append(second)
    assert second.supersedes == ["s0"] and plan.deletes == ["s0"] and [e.id for e in plan.inserts] == ["m2"]
    store.commit_distillation("u", "ep_new", plan.inserts, plan.deletes)
    (old,) = store.semantic_versions("u", ["s0"])
    assert (old.retired_by, old.retired_decision) == ("m2", "conflict")


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


# --- consolidation_min_similarity: dissimilar entries never reach P_con, so P_con can never delete them

def _bob_vs_alice(tmp_path, reply: str, **settings):
    """Store 'Alice lives in Paris.' (cosine 0.06 to the insight) and 'Bob moved house.' (cosine 0.87); the
    episode yields 'Bob lives in Berlin.' and P_con answers ``reply``. Returns (live texts, lm)."""
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, {"Bob moved house.": unit_vector(np.rad2deg(np.arccos(0.87))),
                  "Alice lives in Paris.": unit_vector(np.rad2deg(np.arccos(0.06)))})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=["Bob lives in Berlin."])
    responders["ConsolidateKnowledge"] = lambda i: reply
    lm = ScriptedLM(responders)
    settings.setdefault("consolidation_topic_floor", None)  # the table holds plain vectors only (no masked texts)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({"Bob lives in Berlin.": unit_vector(0)}), None, **settings)(
            user_id="u", episode=_episode(unit_vector(0)))
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    return {e.text for e in store.list_semantic("u")}, lm


def test_conflict_naming_an_entry_below_the_similarity_floor_deletes_nothing(tmp_path, ledger):
    # with the floor only [1] 'Bob moved house.' is a candidate: target 2 (Alice without the floor) is out of range
    live, lm = _bob_vs_alice(tmp_path, chat_reply(action="conflict", targets=[2], merged_text=""))
    assert live == {"Bob moved house.", "Alice lives in Paris.", "Bob lives in Berlin."}
    shown = [inp["existing_entries"] for name, inp in lm.prompts if name == "ConsolidateKnowledge"]
    assert shown == ["[1] Bob moved house."]
    assert "consolidation.deleted" not in ledger.counters


def test_without_the_floor_p_con_sees_and_can_delete_an_unrelated_entry(tmp_path):
    """``consolidation_min_similarity=None`` is the paper's behaviour: the top K_m whatever their cosine."""
    live, _ = _bob_vs_alice(tmp_path, chat_reply(action="conflict", targets=[2], merged_text=""),
                            consolidation_min_similarity=None)
    assert "Alice lives in Paris." not in live


def test_no_p_con_call_when_no_entry_clears_the_floor(tmp_path, ledger):
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, {"Alice lives in Paris.": unit_vector(np.rad2deg(np.arccos(0.06))),
                  "Melanie paints.": unit_vector(np.rad2deg(np.arccos(0.39)))})  # just under the 0.40 floor
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=["Bob lives in Berlin."])
    responders["ConsolidateKnowledge"] = lambda i: chat_reply(action="conflict", targets=[1, 2], merged_text="")
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({"Bob lives in Berlin.": unit_vector(0)}), None)(
            user_id="u", episode=_episode(unit_vector(0)))
    assert "ConsolidateKnowledge" not in lm.calls
    assert [e.text for e in pred.inserts] == ["Bob lives in Berlin."] and pred.deletes == []
    assert ledger.counters["consolidation.new"] == 1 and ledger.counters["consolidation.below_floor"] == 1


def test_a_lower_floor_lets_the_entry_through(tmp_path):
    live, lm = _bob_vs_alice(tmp_path, chat_reply(action="conflict", targets=[2], merged_text=""),
                             consolidation_min_similarity=0.05)
    assert "Alice lives in Paris." not in live


def test_every_deletion_is_logged_with_both_texts_and_counted(tmp_path, caplog, ledger):
    with caplog.at_level("INFO", logger="nemori_dspy.modules.semantic"):
        live, _ = _bob_vs_alice(tmp_path, chat_reply(action="merge", targets=[1],
                                                     merged_text="Bob moved house to Berlin."))
    assert "Bob moved house." not in live and "Bob moved house to Berlin." in live
    assert ledger.counters["consolidation.deleted"] == 1
    line = [r.getMessage() for r in caplog.records if "deletes" in r.getMessage()]
    assert len(line) == 1 and "'Bob moved house.'" in line[0] and "'Bob moved house to Berlin.'" in line[0]


def test_similarity_floor_accepts_off_words():
    assert NemoriSettings(consolidation_min_similarity="off").consolidation_min_similarity is None
    with pytest.raises(ValueError):
        NemoriSettings(consolidation_min_similarity=1.5)


# --- exact duplicates (case, whitespace, trailing punctuation) are not stored twice and cost no P_con call

def test_an_insight_already_stored_is_skipped_without_p_con(tmp_path, ledger):
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, {"Caroline  likes dogs.": unit_vector(10)})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(
        insights=["caroline likes dogs", "Caroline adopted Rex.", "Caroline adopted Rex!"])
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None, consolidation_min_similarity=None)(
            user_id="u", episode=_episode(unit_vector(0)))
    new = [e for e in pred.inserts if e.id != "s0"]
    assert [e.text for e in new] == ["Caroline adopted Rex."] and pred.deletes == []
    # the stored one is not copied, only re-dated in place (same id) to the episode that restated it
    [redated] = [e for e in pred.inserts if e.id == "s0"]
    assert redated.text == "Caroline  likes dogs." and redated.event_start == datetime(2023, 5, 8, 13, 0)
    assert lm.calls.get("ConsolidateKnowledge", 0) == 1  # only for the one new insight
    assert ledger.counters["insight_duplicates_skipped"] == 1


def test_an_insight_equal_to_one_pending_in_the_same_episode_is_skipped(tmp_path, ledger):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    plan_texts = ["Bob lives in Berlin.", "Bob moved to Berlin in 2022.", "bob has lived in berlin since 2022"]
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=plan_texts)
    # P_con merges the second insight into the first; the third then repeats the pending merged entry
    responders["ConsolidateKnowledge"] = lambda i: chat_reply(action="merge", targets=[1],
                                                              merged_text="Bob has lived in Berlin since 2022.")
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None, consolidate_within_episode=True)(
            user_id="u", episode=_episode(unit_vector(0)))
    assert [e.text for e in pred.inserts] == ["Bob has lived in Berlin since 2022."]
    assert ledger.counters["insight_duplicates_skipped"] == 1 and lm.calls["ConsolidateKnowledge"] == 1


def test_a_deleted_entry_does_not_count_as_a_duplicate():
    from nemori_dspy.modules.semantic import Consolidation

    plan = Consolidation(stored={"s0": "bob lives in berlin"})
    assert plan.holds("Bob lives in Berlin.")
    plan.remove(["s0"])
    assert not plan.holds("Bob lives in Berlin.")


# --- machine noise: never sent to P_dis as content, never stored as a fact

TB = 'Traceback (most recent call last):\n  File "/app/run.py", line 3, in <module>\n    go()\nValueError: bad row'


def _noisy_episode(contents: list[str]) -> Episode:
    ts = datetime(2023, 5, 8, 13, 0)
    msgs = [StoredMessage(user_id="u", id=f"D1:{i}", seq=i, speaker="agent" if "ok" in c or "Trace" in c else "Caroline",
                          content=c, timestamp=ts) for i, c in enumerate(contents, 1)]
    return Episode(id="ep_noisy", user_id="u", cue="Caroline and the worker", narrative="n",
                   message_ids=[m.id for m in msgs], messages=msgs, start=ts, end=ts, vector=unit_vector(0))


def _distill_noisy(tmp_path, contents, insights):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=insights)
    lm = ScriptedLM(responders)
    ep = _noisy_episode(contents)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None)(user_id="u", episode=ep)
    return pred, lm, ep


def test_tracebacks_and_heartbeats_are_not_sent_to_the_distiller(tmp_path, ledger):
    pred, lm, ep = _distill_noisy(tmp_path, [TB, "[heartbeat] ok", "I adopted a dog named Rex!"],
                                  ["Caroline adopted a dog named Rex.", "ValueError: bad row"])
    sent = [inp["episode_messages"] for name, inp in lm.prompts if name == "DistillPredictionError"][0]
    assert "Rex" in sent and "Traceback" not in sent and "heartbeat" not in sent
    assert [e.text for e in pred.inserts] == ["Caroline adopted a dog named Rex."]  # the quoted error is dropped
    assert ep.messages[0].content == TB  # the raw messages stay as they were
    assert ledger.counters["noise_messages_skipped"] == 2 and ledger.counters["noise_insights_dropped"] == 1


def test_an_episode_of_noise_only_is_not_distilled(tmp_path):
    pred, lm, _ = _distill_noisy(tmp_path, [TB, "HEARTBEAT seq=7"], ["The worker failed."])
    assert pred.inserts == [] and pred.deletes == [] and lm.calls == {}


def test_an_empty_insight_list_parses_and_stores_nothing(tmp_path, ledger):
    pred, lm, _ = _distill_noisy(tmp_path, ["We just said hello."], [])
    assert pred.inserts == [] and pred.insights == [] and ledger.counters.get("retries", 0) == 0


# --- event time: a fact carries the span of its source episodes, never its ingestion time

INGESTED = datetime(2030, 1, 1, 12, 0)  # a distinctive created_at: it must never reach a prompt


def _spanning_episode(vec) -> Episode:
    """An episode whose messages run from 8 May 2023 13:00 to 9 May 2023 10:00."""
    t0, t1 = datetime(2023, 5, 8, 13, 0), datetime(2023, 5, 9, 10, 0)
    msgs = [StoredMessage(user_id="u", id=f"D1:{i}", seq=i, speaker="Caroline", content=c, timestamp=t)
            for i, (c, t) in enumerate([("I adopted a dog named Rex.", t0), ("Rex loves the park.", t1)], 1)]
    return Episode(id="ep_new", user_id="u", cue="Caroline adopts Rex", narrative="Caroline adopted a dog.",
                   message_ids=[m.id for m in msgs], messages=msgs, start=t0, end=t1, vector=vec)


def _seed_dated(store, entries: dict[str, tuple[list[float], datetime, datetime]]):
    store.check_embedder("table-3", 3)
    rows = [SemanticEntry(id=f"s{i}", user_id="u", text=t, vector=v, event_start=a, event_end=b, created_at=INGESTED)
            for i, (t, (v, a, b)) in enumerate(entries.items())]
    store.commit_distillation("u", "ep_seed", rows, [])


def _dated_run(tmp_path, reply: str, insight="Caroline adopted a dog named Rex."):
    """Stored: 'Caroline likes dogs.' (1-2 Apr 2023, cos 0.98 to the insight), 'Caroline has no pets.'
    (10 Mar 2023, cos 0.94); the spanning episode yields ``insight`` and P_con answers ``reply``."""
    store = SQLiteStore(tmp_path / "m.db")
    _seed_dated(store, {"Caroline likes dogs.": (unit_vector(10), datetime(2023, 4, 1, 9), datetime(2023, 4, 2, 18)),
                        "Caroline has no pets.": (unit_vector(20), datetime(2023, 3, 10, 8), datetime(2023, 3, 10, 8))})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[insight])
    responders["ConsolidateKnowledge"] = lambda i: reply
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({insight: unit_vector(5)}), None)(user_id="u",
                                                                       episode=_spanning_episode(unit_vector(0)))
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    return {e.text: e for e in store.list_semantic("u")}, lm


def test_a_distilled_entry_spans_its_episode_not_its_ingestion(tmp_path):
    live, _ = _dated_run(tmp_path, chat_reply(action="new", targets=[], merged_text=""))
    e = live["Caroline adopted a dog named Rex."]
    assert (e.event_start, e.event_end) == (datetime(2023, 5, 8, 13, 0), datetime(2023, 5, 9, 10, 0))
    assert e.created_at.year >= 2024  # written now, kept apart


def test_a_merge_unions_the_spans_of_its_targets_and_the_episode(tmp_path):
    # the model copies a date prefix into merged_text: it is removed, the span says it instead
    live, _ = _dated_run(tmp_path, chat_reply(action="merge", targets=[1, 2],
                                              merged_text="(2023-03-10 to 2023-05-09) Caroline had no pets, "
                                                          "likes dogs and adopted Rex."))
    merged = live["Caroline had no pets, likes dogs and adopted Rex."]
    assert (merged.event_start, merged.event_end) == (datetime(2023, 3, 10, 8), datetime(2023, 5, 9, 10, 0))
    assert set(live) == {"Caroline had no pets, likes dogs and adopted Rex."}


def test_a_conflict_replacement_spans_only_the_new_episode(tmp_path):
    live, _ = _dated_run(tmp_path, chat_reply(action="conflict", targets=[2], merged_text=""))
    e = live["Caroline adopted a dog named Rex."]
    assert e.supersedes == ["s1"] and e.event_start == datetime(2023, 5, 8, 13, 0)
    assert "Caroline has no pets." not in live


def test_p_con_sees_the_event_dates_of_insight_and_candidates_never_the_ingestion_date(tmp_path):
    _, lm = _dated_run(tmp_path, chat_reply(action="new", targets=[], merged_text=""))
    con = [inp for name, inp in lm.prompts if name == "ConsolidateKnowledge"][0]
    assert con["insight"] == "(2023-05-08 to 2023-05-09) Caroline adopted a dog named Rex."
    assert con["existing_entries"] == ("[1] (2023-04-01 to 2023-04-02) Caroline likes dogs.\n"
                                       "[2] (2023-03-10) Caroline has no pets.")
    today = datetime.now().strftime("%Y-%m-%d")
    for _, inputs in lm.prompts:
        assert all("2030-01-01" not in v and today not in v for v in inputs.values())


def test_p_ant_known_facts_carry_event_dates(tmp_path):
    _, lm = _dated_run(tmp_path, chat_reply(action="new", targets=[], merged_text=""))
    ant = [inp for name, inp in lm.prompts if name == "AnticipateEpisode"][0]
    assert "(2023-04-01 to 2023-04-02) Caroline likes dogs." in ant["known_facts"]
    assert "(2023-03-10) Caroline has no pets." in ant["known_facts"]
    assert "2030-01-01" not in ant["known_facts"]


def test_a_merge_of_an_undated_entry_keeps_the_episode_span(tmp_path):
    """Entries stored before event times were kept have none: a merge takes the known spans only."""
    store, _, live = _consolidate(tmp_path, chat_reply(
        action="merge", targets=[1], merged_text="Caroline loves dogs and adopted Rex in May 2023."))
    merged = live["Caroline loves dogs and adopted Rex in May 2023."]
    assert merged.event_start == merged.event_end == datetime(2023, 5, 8, 13, 0)


def test_a_fact_restated_later_is_re_dated_not_duplicated(tmp_path, ledger):
    """'Caroline lives in Boston.' stated in March and again on 8-9 May: no second copy and no P_con call,
    but the stored entry's span grows to cover May, so it is not mistaken for older than a fact of April."""
    store = SQLiteStore(tmp_path / "m.db")
    _seed_dated(store, {"Caroline lives in Boston.": (unit_vector(10), datetime(2023, 3, 1, 9), datetime(2023, 3, 1, 9))})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=["caroline lives in boston"])
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None)(user_id="u", episode=_spanning_episode(unit_vector(0)))
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    [e] = store.list_semantic("u")
    assert (e.id, e.text) == ("s0", "Caroline lives in Boston.")
    assert (e.event_start, e.event_end) == (datetime(2023, 3, 1, 9), datetime(2023, 5, 9, 10, 0))
    assert "ep_new" in e.source_episode_ids
    assert "ConsolidateKnowledge" not in lm.calls and ledger.counters["insight_duplicates_redated"] == 1
    # the same episode again changes nothing
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        again = _module(store, TableEmbedder({}), None)(user_id="u", episode=_spanning_episode(unit_vector(0)))
    assert again.inserts == [] and again.deletes == []


def test_a_re_dated_entry_is_one_candidate_and_a_conflict_on_it_deletes_the_stored_entry(tmp_path):
    from nemori_dspy.modules.semantic import Consolidation

    old = SemanticEntry(id="s0", user_id="u", text="Bob lives in Paris.", vector=[1.0, 0.0, 0.0])
    plan = Consolidation(stored={"s0": "bob lives in paris"}, entries={"s0": old})
    assert plan.redate("Bob lives in Paris", _spanning_episode(unit_vector(0)))
    assert [e.id for e in plan.inserts] == ["s0"] and plan.inserts[0].event_start == datetime(2023, 5, 8, 13, 0)
    plan.remove(["s0"])
    assert plan.inserts == [] and plan.deletes == ["s0"]


# --- consolidation_mode="batched": one P_con call for every insight of an episode, same semantics and guards
def _batched(tmp_path, reply, insights):
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, {"Caroline likes dogs.": unit_vector(10), "Caroline has no pets.": unit_vector(20),
                  "Melanie paints.": unit_vector(90)})
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=list(insights))
    responders["ConsolidateKnowledgeBatch"] = reply
    emb = TableEmbedder({"Caroline adopted Rex.": unit_vector(5), "Caroline walks Rex daily.": unit_vector(12),
                         "Melanie paints landscapes.": unit_vector(88), "Bob flies planes.": [0.0, 0.0, 1.0]})
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        # the paper's visibility: later insights of the episode see earlier ones as candidates
        pred = _module(store, emb, None, consolidation_mode="batched", consolidate_within_episode=True,
                       consolidation_topic_floor=None)(user_id="u", episode=_episode(unit_vector(0)))  # plain vectors only
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    return lm, {e.text: e for e in store.list_semantic("u")}


def test_batched_consolidation_makes_one_call_with_one_decision_per_insight(tmp_path):
    def reply(i):
        assert i["insight_count"] == "3" and "Insight 3:" in i["insights_with_entries"]
        return chat_reply(decisions=[
            {"insight": 1, "action": "conflict", "targets": [2], "merged_text": ""},   # [2] = has no pets
            {"insight": 2, "action": "merge", "targets": [1], "merged_text": "Caroline walks Rex and likes dogs."},
            {"insight": 3, "action": "new", "targets": [], "merged_text": ""}])
    lm, live = _batched(tmp_path, reply, ["Caroline adopted Rex.", "Caroline walks Rex daily.",
                                          "Melanie paints landscapes.", "Bob flies planes."])
    assert lm.calls.get("ConsolidateKnowledgeBatch") == 1 and "ConsolidateKnowledge" not in lm.calls
    assert "Caroline has no pets." not in live and live["Caroline adopted Rex."].supersedes == ["s1"]
    assert "Caroline walks Rex and likes dogs." in live and "Melanie paints landscapes." in live
    assert "Bob flies planes." in live  # no candidate above the floor: stored as new, never sent to the call
    sent = [i for name, i in lm.prompts if name == "ConsolidateKnowledgeBatch"][0]["insights_with_entries"]
    assert "Bob flies planes." not in sent


def test_batched_consolidation_refuses_out_of_range_and_already_retired_targets(tmp_path, ledger):
    def reply(i):
        return chat_reply(decisions=[
            {"insight": 1, "action": "conflict", "targets": [9], "merged_text": ""},    # out of range: refused
            {"insight": 2, "action": "merge", "targets": [7], "merged_text": "x"}])    # out of range: refused
    _, live = _batched(tmp_path, reply, ["Caroline adopted Rex.", "Caroline walks Rex daily."])
    assert {"Caroline likes dogs.", "Caroline has no pets.", "Melanie paints."} <= set(live)
    assert {"Caroline adopted Rex.", "Caroline walks Rex daily."} <= set(live) and "x" not in live
    assert ledger.counters["consolidation.refused_targets"] == 2


def test_batched_consolidation_never_deletes_an_entry_twice(tmp_path):
    def reply(i):  # both insights name the same stored entry: the second decision finds it retired
        return chat_reply(decisions=[
            {"insight": 1, "action": "conflict", "targets": [1], "merged_text": ""},
            {"insight": 2, "action": "conflict", "targets": [1], "merged_text": ""}])
    _, live = _batched(tmp_path, reply, ["Caroline adopted Rex.", "Caroline walks Rex daily."])
    assert "Caroline likes dogs." not in live and not live["Caroline walks Rex daily."].supersedes


def test_batched_consolidation_falls_back_per_insight_for_missing_decisions(tmp_path, ledger):
    lm, live = _batched(tmp_path, lambda i: chat_reply(decisions=[{"insight": 1, "action": "new"}]),
                        ["Caroline adopted Rex.", "Caroline walks Rex daily."])
    assert lm.calls["ConsolidateKnowledgeBatch"] == 1 and lm.calls["ConsolidateKnowledge"] == 1
    assert ledger.counters["consolidation.batch_fallback"] == 1 and "Caroline walks Rex daily." in live


def test_batched_consolidation_falls_back_per_insight_when_the_reply_does_not_parse(tmp_path):
    lm, live = _batched(tmp_path, lambda i: "no fields here", ["Caroline adopted Rex.", "Caroline walks Rex daily."])
    assert lm.calls["ConsolidateKnowledge"] == 2
    assert {"Caroline adopted Rex.", "Caroline walks Rex daily."} <= set(live)


def test_batched_consolidation_with_one_pending_insight_uses_the_single_call(tmp_path):
    lm, _ = _batched(tmp_path, lambda i: pytest.fail("batch call for one insight"), ["Caroline adopted Rex."])
    assert lm.calls["ConsolidateKnowledge"] == 1 and "ConsolidateKnowledgeBatch" not in lm.calls
def test_default_tau_is_the_embedders_measured_one():
    from nemori_dspy.config import EVOKE_THRESHOLDS, PAPER_EVOKE_THRESHOLD

    assert NemoriSettings().evoke_threshold == EVOKE_THRESHOLDS["all-MiniLM-L6-v2"] == 0.40
    assert NemoriSettings(embedder="openai/text-embedding-3-small").evoke_threshold == PAPER_EVOKE_THRESHOLD == 0.70
    assert NemoriSettings(embedder="hashing-64").evoke_threshold == PAPER_EVOKE_THRESHOLD  # not measured: the paper's
    assert NemoriSettings(evoke_threshold=0.55).evoke_threshold == 0.55  # an explicit τ wins


# --- cost switches with a paper value: P_ant with nothing known, P_con on this episode's own insights

def test_nothing_evoked_means_nothing_predicted_without_a_p_ant_call(tmp_path, ledger):
    from nemori_dspy.modules.semantic import NOTHING_PREDICTED

    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder({}), None)(user_id="u", episode=_episode(unit_vector(0)))
    assert "AnticipateEpisode" not in lm.calls and ledger.counters["anticipate_skipped_no_facts"] == 1
    assert [i for n, i in lm.prompts if n == "DistillPredictionError"][0]["predicted_episode"] == NOTHING_PREDICTED


def test_the_paper_predicts_even_with_nothing_evoked(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder({}), None, anticipate_without_facts=True)(user_id="u", episode=_episode(unit_vector(0)))
    assert lm.calls["AnticipateEpisode"] == 1


def _two_close_insights(tmp_path, **settings):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=["Caroline adopted Rex.", "Caroline has a dog."])
    responders["ConsolidateKnowledge"] = lambda i: chat_reply(action="conflict", targets=[1], merged_text="")
    emb = TableEmbedder({"Caroline adopted Rex.": unit_vector(5), "Caroline has a dog.": unit_vector(8)})
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, emb, None, **settings)(user_id="u", episode=_episode(unit_vector(0)))
    return lm, pred


def test_insights_of_one_episode_are_not_candidates_of_each_other(tmp_path, ledger):
    lm, pred = _two_close_insights(tmp_path)  # cos 3° ≈ 0.999: a P_con 'conflict' would delete the first
    assert "ConsolidateKnowledge" not in lm.calls
    assert [e.text for e in pred.inserts] == ["Caroline adopted Rex.", "Caroline has a dog."] and pred.deletes == []
    assert "consolidation.deleted" not in ledger.counters


def test_the_paper_consolidates_an_insight_against_the_episodes_earlier_ones(tmp_path):
    lm, pred = _two_close_insights(tmp_path, consolidate_within_episode=True)
    assert lm.calls["ConsolidateKnowledge"] == 1 and [e.text for e in pred.inserts] == ["Caroline has a dog."]


def _distill(tmp_path, insights, **settings):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    responders = default_responders()
    responders["DistillPredictionError"] = responders["DistillDirect"] = lambda i: chat_reply(insights=insights)
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        return _module(store, TableEmbedder({}), None, **settings)(user_id="u", episode=_episode(unit_vector(0)))


def _dropped(ledger) -> dict[str, int]:
    return {k: v for k, v in ledger.counters.items() if k.startswith("insights_dropped.")}


def test_a_copied_chat_line_becomes_one_attributed_dated_fact_and_a_question_is_dropped(tmp_path, ledger):
    pred = _distill(tmp_path, ["Caroline: I adopted a dog named Rex.", "What breed is he?",
                               "I adopted a dog named Rex!", "Caroline adopted a dog named Rex on 8 May 2023."])
    # both copies of her message give one fact, quoting the message, dated by its timestamp
    assert pred.insights == ["Caroline said on 2023-05-08: \u201cI adopted a dog named Rex.\u201d",
                             "Caroline adopted a dog named Rex on 8 May 2023."]
    assert [e.text for e in pred.inserts] == pred.insights
    assert _dropped(ledger) == {"insights_dropped.question": 1} and ledger.counters["insights_attributed"] == 1


def test_a_reported_question_is_dropped_as_a_question(tmp_path, ledger):
    # conv-49 (2026-12-04): "Evan asks Sam if he has any recipes for grilled dishes." was stored as a fact
    pred = _distill(tmp_path, ["Melanie asks Caroline if she has any pets.", "Caroline asked Melanie what she painted.",
                               "Caroline adopted a dog named Rex on 8 May 2023."])
    assert pred.insights == ["Caroline adopted a dog named Rex on 8 May 2023."]
    assert _dropped(ledger) == {"insights_dropped.question": 2}



@pytest.mark.parametrize("distillation", ["prediction_error", "direct"])
def test_junk_and_fragments_are_never_stored_and_each_is_counted(tmp_path, ledger, distillation):
    from nemori_dspy.modules.semantic import NOTHING_PREDICTED

    pred = _distill(tmp_path, [
        "reading", "but when I look after myself", "relationships", "preferences",    # comma pieces, instruction
        "The prediction missed the following facts: Gina's identity",                  # talk about the task
        "no information about these people yet", NOTHING_PREDICTED,                   # placeholders
        "third-person narrative with absolute dates, 2-6 sentences",                  # P_nar's field description
        "Caroline adopted a dog named Rex on 8 May 2023."], distillation=distillation)
    assert pred.insights == ["Caroline adopted a dog named Rex on 8 May 2023."]
    dropped = _dropped(ledger)
    assert set(dropped) <= {f"insights_dropped.{r}" for r in
                            ("instruction_echo", "field_description_echo", "placeholder", "fragment",
                             "first_person")}
    assert sum(dropped.values()) == 8 and dropped["insights_dropped.placeholder"] == 2
    assert dropped["insights_dropped.fragment"] >= 1  # "but when I look after myself" may go as first_person


def test_a_greeting_copied_from_the_episode_is_dropped_as_no_fact(tmp_path, ledger):
    ts = datetime(2023, 5, 8, 13, 0)
    msgs = [StoredMessage(user_id="u", id=f"D1:{i}", seq=i, speaker=who, content=text, timestamp=ts)
            for i, (who, text) in enumerate([("Jolene", "Hi Deb! Good to meet you!"),
                                             ("Deborah", "I started a pottery class on Monday.")], 1)]
    ep = Episode(id="ep_new", user_id="u", cue="c", narrative="n", message_ids=[m.id for m in msgs], messages=msgs,
                 start=ts, end=ts, vector=unit_vector(0))
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[
        "Jolene: Hi Deb! Good to meet you!", "I started a pottery class on Monday."])
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None)(user_id="u", episode=ep)
    assert pred.insights == ["Deborah said on 2023-05-08: \u201cI started a pottery class on Monday.\u201d"]
    assert _dropped(ledger) == {"insights_dropped.no_fact": 1}


def test_the_rendered_messages_alone_give_the_dates_for_callers_without_stored_messages():
    from nemori_dspy.modules.semantic import clean_insights

    assert clean_insights(["Sam: I quit the bakery"], "[2023-09-15 10:00]\nSam: I quit the bakery.") == [
        "Sam said on 2023-09-15: \u201cI quit the bakery.\u201d"]


def _two_speaker_episode(vec) -> Episode:
    ts = datetime(2023, 5, 8, 13, 0)
    msgs = [StoredMessage(user_id="u", id="D1:1", seq=1, speaker="Caroline", content="I went to a support group.",
                          timestamp=ts),
            StoredMessage(user_id="u", id="D1:2", seq=2, speaker="Melanie", content="I joined a painting group.",
                          timestamp=ts)]
    return Episode(id="ep_new", user_id="u", cue="Caroline and Melanie talk", narrative="They talked.",
                   message_ids=["D1:1", "D1:2"], messages=msgs, start=ts, end=ts, vector=vec)


def _person_run(tmp_path, reply: str, seeds: dict[str, list[float]]):
    store = SQLiteStore(tmp_path / "m.db")
    _seed(store, seeds)
    insight = "Caroline went to an LGBTQ support group on 7 May 2023."
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[insight])
    responders["ConsolidateKnowledge"] = lambda i: reply
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({insight: unit_vector(5)}), None)(
            user_id="u", episode=_two_speaker_episode(unit_vector(0)))
    store.commit_distillation("u", "ep_new", pred.inserts, pred.deletes)
    return lm, {e.text for e in store.list_semantic("u")}


def test_a_fact_about_another_speaker_never_reaches_p_con_however_similar(tmp_path, ledger):
    """Seen on conv-26 with MiniLM: Melanie's painting group scored above the floor against Caroline's support
    group, and P_con merged them into 'Melanie mentions going to a LGBTQ support group'."""
    lm, live = _person_run(tmp_path, chat_reply(action="conflict", targets=[1], merged_text=""),
                           {"Melanie found a painting support group.": unit_vector(8)})
    assert not [name for name, _ in lm.prompts if name == "ConsolidateKnowledge"]  # no candidate left: no call
    assert live == {"Melanie found a painting support group.",
                    "Caroline went to an LGBTQ support group on 7 May 2023."}
    assert ledger.counters["consolidation.other_person"] == 1


def test_a_merge_whose_text_moves_the_fact_to_another_person_is_stored_as_new(tmp_path, ledger):
    lm, live = _person_run(tmp_path, chat_reply(action="merge", targets=[1],
                                                merged_text="Melanie mentions going to a LGBTQ support group."),
                           {"Caroline likes support groups.": unit_vector(8)})
    assert [name for name, _ in lm.prompts if name == "ConsolidateKnowledge"]
    assert live == {"Caroline likes support groups.", "Caroline went to an LGBTQ support group on 7 May 2023."}
    assert ledger.counters["consolidation.merge_refused_person"] == 1


def test_a_merge_that_drops_what_a_target_states_is_stored_as_new(tmp_path, ledger):
    """Seen with the 1.5B model: a support-group fact 'merged' into a charity-race one lost every detail of it."""
    lm, live = _person_run(tmp_path, chat_reply(
        action="merge", targets=[1], merged_text="Caroline helped with the charity race; it was so powerful."),
        {"Caroline ran a charity race for mental health.": unit_vector(8)})
    assert live == {"Caroline ran a charity race for mental health.",
                    "Caroline went to an LGBTQ support group on 7 May 2023."}
    assert ledger.counters["consolidation.merge_refused_content"] == 1



def test_a_merge_whose_text_comments_on_memory_is_stored_as_new(tmp_path, ledger):
    """Seen with the bootstrap-tuned P_con on conv-42: merged texts ending in '… This information is already present
    in the existing entries for …' were stored as facts."""
    merged = ("Caroline ran a charity race for mental health and went to an LGBTQ support group on 7 May 2023. "
              "This information is already present in the existing entries for Caroline.")
    lm, live = _person_run(tmp_path, chat_reply(action="merge", targets=[1], merged_text=merged),
                           {"Caroline ran a charity race for mental health.": unit_vector(8)})
    assert live == {"Caroline ran a charity race for mental health.",
                    "Caroline went to an LGBTQ support group on 7 May 2023."}
    assert ledger.counters["consolidation.merge_refused_junk"] == 1

def test_keeps_content_accepts_a_merge_that_keeps_both_facts():
    from nemori_dspy.modules.semantic import keeps_content

    assert keeps_content("Caroline loves dogs and adopted Rex in May 2023.",
                         ["Caroline adopted a dog named Rex in May 2023.", "Caroline loves dogs."])
    assert not keeps_content("Caroline loves dogs.", ["Caroline adopted a dog named Rex in May 2023."])


def test_relative_date_notes_are_not_stored_in_facts():
    from nemori_dspy.modules.semantic import clean_insights

    assert clean_insights(["Caroline went to a support group on 7 May 2023 (yesterday)."]) == [
        "Caroline went to a support group on 7 May 2023."]


def test_a_seed_demo_fact_the_episode_never_said_is_dropped_with_its_reason():
    from nemori_dspy.modules.semantic import clean_insights
    from nemori_dspy.usage import UsageLedger

    ledger = UsageLedger()
    with ledger.charging():
        kept = clean_insights(["Tom's bike was at a repair shop in March 2022.", "Sam cycles to work every day."],
                              "[2023-09-15 10:00]\nSam: I cycle to work every day now.\nEvan: Nice!")
    assert kept == ["Sam cycles to work every day."]
    assert ledger.counters.get("insights_dropped.demo_echo") == 1



def test_a_fact_misdating_the_event_its_message_dates_gets_the_message_date_and_is_counted():
    from nemori_dspy.modules.semantic import clean_insights
    from nemori_dspy.usage import UsageLedger

    rendered = ("[2023-05-25 13:00]\nMelanie: I ran a charity race for mental health last Saturday.\n"
                "Caroline: That's great, well done!")
    ledger = UsageLedger()
    with ledger.charging():
        kept = clean_insights(["Melanie ran a charity race for mental health on 25 May 2023.",
                               "Melanie ran a charity race for mental health in May 2023."], rendered)
    assert kept == ["Melanie ran a charity race for mental health on 20 May 2023.",
                    "Melanie ran a charity race for mental health in May 2023."]  # coarser but right: kept
    assert ledger.counters.get("insights_redated") == 1


# --- distill_chunk_messages: P_dis on runs of an episode's messages

def _msgs(n: int) -> list[StoredMessage]:
    ts = datetime(2023, 5, 8, 13, 0)
    return [StoredMessage(user_id="u", id=f"D1:{i}", seq=i, speaker="Caroline" if i % 2 else "Melanie",
                          content=f"Message number {i} about topic {i}.", timestamp=ts) for i in range(1, n + 1)]


@pytest.mark.parametrize("n, size, lengths", [(23, 8, [8, 7, 8]), (16, 8, [8, 8]), (8, 8, [8]), (5, None, [5]),
                                              (9, 8, [4, 5])])
def test_message_runs_are_consecutive_even_runs_of_at_most_the_size(n, size, lengths):
    from nemori_dspy.modules.semantic import message_runs

    chunks = message_runs(_msgs(n), size)
    assert [len(c) for c in chunks] == lengths
    assert [m.id for c in chunks for m in c] == [m.id for m in _msgs(n)]


def test_chunked_distillation_calls_p_dis_per_run_against_one_prediction(tmp_path, ledger):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    msgs = _msgs(10)
    ep = _episode(unit_vector(0)).model_copy(update={"messages": msgs, "message_ids": [m.id for m in msgs]})
    responders = default_responders()
    # each run's P_dis reply names the first message it saw; both runs also repeat one fact, kept once
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[
        f"Caroline spoke about topic {i['episode_messages'].split('topic ')[1].split('.')[0]} on 8 May 2023.",
        "Melanie has two children."])
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = _module(store, TableEmbedder({}), None, distill_chunk_messages=5, anticipate_without_facts=True)(
            user_id="u", episode=ep)
    dis = [inp for name, inp in lm.prompts if name == "DistillPredictionError"]
    assert len(dis) == 2 and "topic 1." in dis[0]["episode_messages"] and "topic 6." in dis[1]["episode_messages"]
    assert "topic 6." not in dis[0]["episode_messages"] and "topic 5." not in dis[1]["episode_messages"]
    assert dis[0]["predicted_episode"] == dis[1]["predicted_episode"]
    assert [n for n, _ in lm.prompts].count("AnticipateEpisode") == 1
    assert pred.insights == ["Caroline spoke about topic 1 on 8 May 2023.", "Melanie has two children.",
                             "Caroline spoke about topic 6 on 8 May 2023."]
    assert ledger.counters["distill_chunks"] == 2


def test_without_chunking_p_dis_sees_the_whole_episode_once(tmp_path):
    """distill_chunk_messages=None is the paper's one P_dis call per episode (§3.3.2)."""
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    msgs = _msgs(10)
    ep = _episode(unit_vector(0)).model_copy(update={"messages": msgs, "message_ids": [m.id for m in msgs]})
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder({}), None, distill_chunk_messages=None)(user_id="u", episode=ep)
    dis = [inp for name, inp in lm.prompts if name == "DistillPredictionError"]
    assert len(dis) == 1 and "topic 1." in dis[0]["episode_messages"] and "topic 10." in dis[0]["episode_messages"]


def test_a_merge_that_only_strings_its_sources_together_is_stored_as_new(tmp_path, ledger):
    """Seen with the 1.5B model: 'Caroline went to a support group …; she is excited about creating a family …'."""
    lm, live = _person_run(tmp_path, chat_reply(
        action="merge", targets=[1], merged_text="Caroline went to an LGBTQ support group on 7 May 2023; "
                                                 "Caroline is excited about creating a family."),
        {"Caroline is excited about creating a family.": unit_vector(8)})
    assert live == {"Caroline is excited about creating a family.",
                    "Caroline went to an LGBTQ support group on 7 May 2023."}
    assert ledger.counters["consolidation.merge_refused_glued"] == 1


def test_glued_tells_a_concatenation_from_a_merged_statement():
    from nemori_dspy.modules.semantic import glued

    sources = ["(2022-05-02) Priya's pottery class meets on Thursday evenings.",
               "Priya is starting a pottery class in April 2022."]
    assert not glued("Priya started a pottery class in April 2022; it meets on Thursday evenings.", sources)
    assert not glued("Priya's pottery class, started in April 2022, meets on Thursday evenings.", sources)
    assert glued("Priya is starting a pottery class in April 2022. Priya's pottery class meets on Thursday "
                 "evenings.", sources)


def test_a_predicate_glued_on_with_a_pronoun_is_refused_and_a_real_merge_is_kept():
    from nemori_dspy.modules.semantic import glued_by_pronoun, merge_refusal

    photo = "Melanie shared a photo of her husband and kids from the same week."
    painting = ["Melanie's painting is special to her."]
    assert glued_by_pronoun(photo[:-1] + "; it is special to her.", photo, painting)
    assert merge_refusal(photo[:-1] + "; it is special to her.", photo, painting, {"melanie"}) == "glued"
    screenplay = "Joanna's new screenplay is about drama and romance."
    assert glued_by_pronoun(screenplay[:-1] + "; it meets on Thursday evenings.", screenplay,
                            ["Joanna is writing a new screenplay."])  # said by no source
    # the tail says what the target says of the same class; the tail carries the insight's news
    assert not glued_by_pronoun("Priya started a pottery class in April 2022; it meets on Thursday evenings.",
                                "Priya is starting a pottery class in April 2022.",
                                ["Priya's pottery class meets on Thursday evenings."])
    assert not glued_by_pronoun("Caroline went to a support group on 7 May 2023; it made her feel accepted.",
                                "The support group made Caroline feel accepted.",
                                ["Caroline went to a support group on 7 May 2023."])
    assert not glued_by_pronoun("Priya's pottery class, started in April 2022, meets on Thursday evenings.",
                                "Priya is starting a pottery class in April 2022.",
                                ["Priya's pottery class meets on Thursday evenings."])


def test_a_merge_that_rewrites_a_quoted_passage_is_stored_as_new(tmp_path, ledger):
    quote = "Caroline said on 2023-05-08: “We're thinking about going camping next month.”"
    lm, live = _person_run(tmp_path, chat_reply(
        action="merge", targets=[1], merged_text="Caroline went to an LGBTQ support group on 7 May 2023 and said: "
                                                 "“We're thinking about going fun camping in June 2023.”"),
        {quote: unit_vector(8)})
    assert quote in live and ledger.counters["consolidation.merge_refused_quote"] == 1


def test_keeps_quotes_ignores_case_spacing_and_punctuation():
    from nemori_dspy.modules.semantic import keeps_quotes

    src = ["Sam said on 2023-09-15: “I quit the bakery, finally!”"]
    assert keeps_quotes("Sam quit his job; he said: “i quit the bakery finally”.", src)
    assert not keeps_quotes("Sam said: “I quit the bakery in September 2023.”", src)
    assert keeps_quotes("Sam quit the bakery.", src)


def test_an_insight_that_names_nobody_and_opens_with_a_pronoun_is_dropped(ledger):
    from nemori_dspy.modules.semantic import clean_insights

    msgs = _msgs(4)
    kept = clean_insights(["They share stories, advice and encouragement from the group.",
                           "She said the group meets weekly.",  # names nobody: dropped
                           "They told Caroline the group meets weekly.",  # names a speaker: kept
                           "Melanie has two children."], source=msgs)
    assert kept == ["They told Caroline the group meets weekly.", "Melanie has two children."]
    assert ledger.counters["insights_dropped.no_subject"] == 2


def test_an_insight_copied_from_the_prediction_that_no_message_holds_is_dropped(ledger):
    from nemori_dspy.modules.semantic import NOTHING_PREDICTED, clean_insights

    msgs = ("[2023-05-25 13:14]\nMelanie: I ran a charity race for mental health on 20 May 2023. It made me think "
            "about self-care.\nCaroline: That's great, Mel! I'm proud of you.")
    predicted = "Melanie tells Caroline about her charity race and plans to adopt a child."
    insights = ["Melanie ran a charity race for mental health on 20 May 2023.", "Melanie is planning to adopt a child."]
    assert clean_insights(insights, msgs, predicted=predicted) == insights[:1]
    assert ledger.counters["insights_dropped.predicted_only"] == 1
    assert clean_insights(insights, msgs, predicted=NOTHING_PREDICTED) == insights  # no prediction to copy
    assert clean_insights(insights, msgs) == insights


def test_settle_decision_is_the_rule_the_pipeline_stores_by():
    from nemori_dspy.modules.semantic import settle_decision

    target = ["Caroline ran a charity race for mental health."]
    kept = "Caroline ran a charity race for mental health and went to an LGBTQ support group."
    assert settle_decision("merge", [1], f"(2023-05-08) {kept}", "Caroline went to an LGBTQ support group.", target,
                           {"caroline"}) == ("merge", [1], kept, None)
    assert settle_decision("merge", [1], "Caroline helped with the charity race; it was so powerful.",
                           "Caroline went to an LGBTQ support group.", target, {"caroline"}) == ("new", [], "", "content")
    assert settle_decision("merge", [1], "", "x", target, set()) == ("new", [], "", None)
    assert settle_decision("conflict", [], "", "x", [], set()) == ("new", [], "", None)
    assert settle_decision("conflict", [1], "ignored", "x", target, set()) == ("conflict", [1], "", None)
    assert settle_decision("unsure", [1], "", "x", target, set()) == ("new", [], "", None)


def _topic_run(tmp_path, **settings):
    """Stored: 'Caroline likes hiking.' at cosine 1.0 to the insight (the shared name); masked, the two texts are
    orthogonal ('someone likes hiking.' vs 'someone went to an LGBTQ support group …')."""
    store = SQLiteStore(tmp_path / "m.db")
    insight = "Caroline went to an LGBTQ support group on 7 May 2023."
    _seed(store, {"Caroline likes hiking.": unit_vector(5)})
    table = {insight: unit_vector(5), "someone went to an LGBTQ support group on 7 May 2023.": unit_vector(0),
             "someone likes hiking.": unit_vector(90)}
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: chat_reply(insights=[insight])
    responders["ConsolidateKnowledge"] = lambda i: chat_reply(action="new", targets=[], merged_text="")
    lm = ScriptedLM(responders)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        _module(store, TableEmbedder(table), None, **settings)(user_id="u", episode=_two_speaker_episode(unit_vector(0)))
    return [name for name, _ in lm.prompts if name == "ConsolidateKnowledge"]


def test_a_candidate_sharing_only_the_persons_name_stays_away_from_p_con_under_the_topic_floor(tmp_path, ledger):
    assert _topic_run(tmp_path) == []  # the default floor
    assert ledger.counters["consolidation.other_topic"] == 1


def test_without_the_topic_floor_the_same_candidate_reaches_p_con(tmp_path, ledger):
    assert _topic_run(tmp_path, consolidation_topic_floor=None) == ["ConsolidateKnowledge"]
    assert "consolidation.other_topic" not in ledger.counters


def test_a_merge_saying_i_or_we_outside_a_quote_where_no_source_does_is_refused():
    from nemori_dspy.modules.semantic import adds_first_person, merge_refusal

    insight = "Caroline told Melanie about choosing adoption services for LGBTQ+ folks."
    target = "Caroline went to a LGBTQ support group on 7 May 2023."
    copied = f"{insight[:-1]}; the transgender stories were so inspiring! I was so happy and thankful for the support."
    assert merge_refusal(copied, insight, [target], {"caroline", "melanie"}) == "first_person"
    # inside a quote, or said by a source already, first-person words are no sign of a copied chat line
    assert not adds_first_person("Sam said: “I quit my job.” He moved to Lisbon.", ["Sam said: “I quit my job.”"])
    assert not adds_first_person("Sam and I met at the bakery.", ["Sam and I met in 2020."])
    assert adds_first_person("Sam’s kids love us.", ["Sam's kids love the park."])
