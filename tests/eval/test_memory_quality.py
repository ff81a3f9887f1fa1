"""eval.memory_quality: gold observations, the fact matcher (validated on tests/data/fact_match_pairs.jsonl) and
the memory metrics over a scripted SQLite store (hashing embedder; no network, no LLM)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nemori_dspy.embedders import HashingEmbedder, find_minilm_dir
from nemori_dspy.eval import memory_quality as mq
from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, SemanticEntry
from tests.fakes import SYNTHETIC_MINI

USER = "synth-1"


@pytest.fixture
def session1():
    return slice_sessions(load_locomo(SYNTHETIC_MINI)[0], parse_sessions("1"))


def test_observations_are_loaded_and_cut_to_the_built_turns():
    conv = load_locomo(SYNTHETIC_MINI)[0]
    assert len(conv.observations) == 25 and set(conv.session_summaries) == {1, 2, 3}
    assert conv.observations[4].dia_ids == ["D1:13", "D1:14"]  # a list dia_id
    golds = mq.gold_observations(conv)
    assert len(golds) == 24  # D3:99 resolves to no turn
    sliced = mq.gold_observations(slice_sessions(conv, parse_sessions("1-2")))
    assert {g.session for g in sliced} == {1, 2} and len(sliced) == 18


def test_token_overlap_and_clashes():
    assert mq.content_recall("Noor made four bowls.", "Noor: I made four lopsided bowls") == 1.0
    assert mq.content_recall("Lena went to a pottery workshop last week.", "Lena went to a pottery workshop.") == 1.0
    assert mq.clash("Priya adopted a cat named Biscuit.", "Hana adopted a cat named Biscuit.") == "name"
    assert mq.clash("Hana has collected cameras for six years.", "Hana has collected cameras for 2 years.") == "number"
    assert mq.clash("Lena passed her test two weeks ago.", "Lena passed her test on 20 September 2022.") is None
    assert mq.clash("Lena eats meat.", "Lena does not eat meat.") == "negation"
    assert mq.clash("Hana is allergic to peanuts.", "Hana: I can't have the satay, I'm allergic to peanuts.") is None
    assert mq.clash("Mireille's daughter is Claire.", "Mireille's sister is Claire.") == "relative"


def test_matcher_with_a_deterministic_embedder_needs_both_cosine_and_overlap():
    m = mq.FactMatcher(HashingEmbedder(512), cosine_min=0.5, recall_min=0.6, cosine_strong=0.99)
    gold = "Elias built his first boat, a small rowing boat, in 2019."
    assert m.matches(gold, "In 2019 Elias built his first boat, a small rowing boat.")
    assert not m.matches(gold, "Noor built her first boat, a small rowing boat, in 2019.")  # another person
    assert not m.matches(gold, "Elias likes boats.")  # low overlap
    assert not m.matches(gold, "rowing boat")  # a fragment
    assert m.match_matrix([gold, "Pepper steals socks."], ["Elias built his first boat in 2019.", "x"]).shape == (2, 2)


def test_pairs_file_is_big_enough_and_labelled():
    pairs = mq.load_pairs()
    assert len(pairs) >= 60
    assert {p["match"] for p in pairs} == {True, False}
    assert all(isinstance(p["note"], str) and p["gold"] and p["candidate"] for p in pairs)


def test_load_pairs_rejects_a_broken_file(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"gold": "a"}\n')
    with pytest.raises(mq.DatasetError):
        mq.load_pairs(bad)


@pytest.mark.skipif(find_minilm_dir() is None, reason="all-MiniLM-L6-v2 is not on this machine")
def test_matcher_precision_and_recall_on_the_pairs_with_minilm():
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    result = mq.validate(mq.FactMatcher(resolve_embedder(NemoriSettings())), mq.load_pairs())
    assert result["precision"] >= 0.85 and result["recall"] >= 0.8
    assert result["n"] == mq.VALIDATED["n"]
    for key in ("precision", "recall", "f1"):  # the caption's figures are the ones validate prints
        assert result[key] == pytest.approx(mq.VALIDATED[key])


@pytest.mark.skipif(find_minilm_dir() is None, reason="all-MiniLM-L6-v2 is not on this machine")
def test_support_checker_precision_and_recall_on_its_pairs_with_minilm():
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    embedder = resolve_embedder(NemoriSettings())
    pairs = mq.load_support_pairs()
    result = mq.validate_support(mq.SupportChecker(embedder), pairs)
    assert result["n"] == mq.SUPPORT_VALIDATED["n"] and len({p["kind"] for p in pairs}) >= 10
    for key in ("precision", "recall", "f1"):
        assert result[key] == pytest.approx(mq.SUPPORT_VALIDATED[key])
    # the whole-message rule it replaced found a fifth of the supported facts
    old = [bool(mq.FactMatcher(embedder).match_matrix([p["fact"]], [p["source"]])[0, 0]) for p in pairs]
    assert sum(o and p["supported"] for o, p in zip(old, pairs)) < result["tp"] / 2


def test_units_drop_the_listeners_name_and_pair_a_question_with_its_answer():
    lines = [("Priya", "May 2023", "Hey Tomas! I repainted the spare room. It looks fresh."),
             ("Tomas", "May 2023", "Wow, Priya! What colour did you pick?"),
             ("Priya", "May 2023", "Sage green. Took all weekend.")]
    units = dict(mq.support_units(lines))
    assert units["Priya (May 2023): I repainted the spare room."] == {"priya"}  # "Hey Tomas!" only addressed him
    assert "Priya (May 2023): I repainted the spare room. It looks fresh." in units
    qa = "Tomas (May 2023): What colour did you pick? Priya (May 2023): Sage green."
    assert units[qa] == {"priya"}
    assert not any(u.startswith("Priya (May 2023): It looks fresh. Tomas") for u in units)  # no question asked


def test_a_unit_speaking_of_the_listener_is_about_the_listener_and_a_question_alone_states_nothing():
    lines = [("Priya", "May 2023", "That's really sweet. Is this your own painting?"),
             ("Tomas", "May 2023", "Yeah, I painted that harbour last year! It's special to me.")]
    units = dict(mq.support_units(lines))
    assert units["Priya (May 2023): That's really sweet. Is this your own painting?"] == {"tomas"}
    assert "Priya (May 2023): Is this your own painting?" not in units
    assert units["Tomas (May 2023): Yeah, I painted that harbour last year!"] == {"tomas"}
    # with a third speaker the listener is unknown: the unit is about nobody it does not name
    crowd = [*lines, ("Ines", "May 2023", "Lovely colours!")]
    assert dict(mq.support_units(crowd))["Priya (May 2023): That's really sweet. Is this your own painting?"] == set()


def test_a_fact_resting_only_on_what_its_subject_said_of_the_listener_is_not_supported():
    checker = mq.SupportChecker(HashingEmbedder(512), cosine_min=0.3, recall_min=0.5)
    lines = [("Noor", "May 2023", "So I'm carving out some me-time each day for running."),
             ("Elias", "May 2023", "Taking time for yourself each day for running is so important.")]
    assert checker.supported(["Noor is carving out time each day for running.",
                              "Elias is taking time each day for running."], lines) == [True, False]


def test_support_needs_a_unit_about_the_subject_and_no_plan_stated_as_done():
    checker = mq.SupportChecker(HashingEmbedder(512), cosine_min=0.3, recall_min=0.5)
    lines = [("Priya", "May 2023", "Hey Tomas! I repainted the spare room sage green this weekend."),
             ("Tomas", "May 2023", "Nice! I'm thinking about adopting a terrier from the shelter.")]
    flags = checker.supported(["Priya repainted the spare room sage green.",
                               "Tomas helped Priya repaint the spare room sage green.",
                               "Tomas adopted a terrier from the shelter.",
                               "Tomas is thinking about adopting a terrier from the shelter.",
                               "Priya said on 2023-05-08: \u201cI repainted the spare room sage green this weekend.\u201d",
                               "Tomas said on 2023-05-08: \u201cI repainted the spare room sage green this weekend.\u201d"],
                              lines)
    assert flags == [True, False, False, True, True, False]


def test_support_needs_the_date_the_message_gives_and_no_past_event_told_as_a_plan():
    checker = mq.SupportChecker(HashingEmbedder(512), cosine_min=0.3, recall_min=0.5)
    lines = [("Sofia", "June 2023", "Thanks Noor! We got married in 2018 (5 years ago) at the lake house."),
             ("Malik", "May 2023", "I ran the charity 5k on 20 May 2023 (last Saturday) with my cousin."),
             ("Wren", "July 2023", "Went to the harbour festival with my sister, so much fun."),
             ("Keiko", "June 2023", "I wanted to tell you about my school talk in the week of 2 June 2023 (last week).")]
    flags = checker.supported(["Sofia got married at the lake house in 2018.",
                               "Sofia got married at the lake house in June 2023.",  # the send month, not the event's
                               "Malik ran the charity 5k with his cousin on 20 May 2023.",
                               "Malik ran the charity 5k with his cousin on 21 May 2023.",  # a day off
                               "Malik ran the charity 5k with his cousin in May 2023.",  # coarser, still right
                               "Malik is planning to run the charity 5k with his cousin.",  # done, told as a plan
                               "Wren went to the harbour festival with her sister in July 2023.",  # the send month
                               "Keiko is looking forward to her school talk in June 2023."],  # "in the week of" is past
                              lines, {"sofia", "malik", "wren", "noor", "keiko"})
    assert flags == [True, False, True, False, True, False, True, False]


def test_a_unit_supports_through_its_message_text_not_only_its_speaker_and_month():
    checker = mq.SupportChecker.with_matcher(type("Yes", (), {"match_matrix": staticmethod(
        lambda texts, units: np.ones((len(texts), len(units)), dtype=bool))})())
    lines = [("Melanie", "June 2023", "Great news, I painted a lake at sunrise!")]
    assert checker.supported(["Melanie put on her wedding dress in June 2023.", "Melanie painted a lake in June 2023."],
                             lines) == [False, True]


def test_a_leading_pronoun_reads_as_the_person_the_sentence_before_is_about():
    people = {"caroline", "mel"}
    sents = ["Caroline went to a support group on 7 May 2023.", "She said it made her feel accepted.",
             "Her friends were there.", "It was great.", "He's fine.", "They left.", "Mel's kids swam.", "She smiled."]
    assert mq.resolve_pronouns(sents, people) == [
        sents[0], "Caroline said it made her feel accepted.", "Caroline's friends were there.", "It was great.",
        "He's fine.", "They left.", "Mel's kids swam.", "Mel smiled."]
    assert mq.resolve_pronouns(["She said hi.", "Mel agreed."], people) == ["She said hi.", "Mel agreed."]


def _narrative_store(tmp_path: Path, conv, narratives: list[str]) -> SQLiteStore:
    """One episode per narrative (ids ep0, ep1, …), each over the first four messages of ``conv``."""
    store = SQLiteStore(tmp_path / "m.sqlite3")
    emb = HashingEmbedder(64)
    store.check_embedder(emb.name, emb.dim)
    stored = store.add_messages(USER, conv.messages)[:4]
    vec = emb.embed(["x"])[0].tolist()
    for k, narrative in enumerate(narratives):
        store.commit_window(USER, k, [Episode(id=f"ep{k}", user_id=USER, cue="pottery", narrative=narrative,
                                              message_ids=[m.id for m in stored], start=stored[0].timestamp,
                                              end=stored[-1].timestamp, vector=vec)], [])
    return store


def test_a_pronoun_led_narrative_sentence_is_checked_as_its_persons(tmp_path, session1):
    """The checker sees "Noor said …" for "She said …" after a sentence about Noor, so a unit about Noor supports it;
    after a sentence about Elias it needs a unit about Elias, and none says it."""
    said = "She said she made four lopsided bowls and one of them holds water."
    store = _narrative_store(tmp_path, session1, [f"{before} {said}" for before in (
        "Noor went to her first pottery class.", "Elias asked about the class.")])
    verdicts = {v.id: v for v in mq.audit_memory(store, session1, _matcher(), support=_support()).narratives}
    assert verdicts["ep0"].supported[1] is True and verdicts["ep0"].sentences[1] == said  # shown as written
    assert verdicts["ep1"].supported[1] is False
    store.close()


def _store(tmp_path: Path, conv) -> SQLiteStore:
    """Session 1 of synth-1 as two episodes (D1:1-D1:10 and D1:11-D1:19) and six scripted facts."""
    store = SQLiteStore(tmp_path / "m.sqlite3")
    emb = HashingEmbedder(64)
    store.check_embedder(emb.name, emb.dim)
    stored = store.add_messages(USER, conv.messages)
    vec = emb.embed(["x"])[0].tolist()
    halves = [stored[:10], stored[10:]]
    narratives = [
        "Noor told Elias that she made four lopsided bowls and one of them holds water. Elias flew to the moon.",
        "A faithful third-person account of what happened and what was said, naming the speakers.",
    ]
    eps = [Episode(id=f"ep{i}", user_id=USER, cue=f"cue {i}", narrative=narratives[i], message_ids=[m.id for m in h],
                   start=h[0].timestamp, end=h[-1].timestamp, vector=vec) for i, h in enumerate(halves)]
    store.commit_window(USER, 0, eps, [])
    facts = {"ep0": ["Elias built his first boat, a small rowing boat, in 2019.",  # supported, matches gold
                     "reading",  # fragment
                     "Elias owns a submarine."],  # unsupported
             "ep1": ["relationships",  # junk (and fragment)
                     "Noor has worked on the children's ward for four years.",  # supported, matches gold
                     "You should be proud. What made you pick up pottery?"]}  # verbatim copy of D1:15
    for ep, texts in facts.items():
        store.commit_distillation(USER, ep, [SemanticEntry(id=f"{ep}-{k}", user_id=USER, text=t, vector=vec,
                                                           source_episode_ids=[ep]) for k, t in enumerate(texts)], [])
    return store


def _matcher() -> mq.FactMatcher:
    return mq.FactMatcher(HashingEmbedder(512), cosine_min=0.4, recall_min=0.6, cosine_strong=0.99)


def _support() -> mq.SupportChecker:
    return mq.SupportChecker(HashingEmbedder(512), cosine_min=0.4, recall_min=0.6)


def test_audit_of_a_scripted_memory(tmp_path, session1):
    store = _store(tmp_path, session1)
    audit = mq.audit_memory(store, session1, _matcher(), support=_support())
    m = audit.metrics
    assert (m.sessions, m.messages, m.episodes, m.entries, m.gold) == (1, 19, 2, 6, 9)
    assert m.gold_matched == 2 and m.fact_recall == pytest.approx(2 / 9)
    verdict = {f.text: f for f in audit.facts}
    assert verdict["Elias built his first boat, a small rowing boat, in 2019."].counts_as_support
    assert verdict["reading"].fragment and not verdict["reading"].counts_as_support
    assert not verdict["Elias owns a submarine."].supported
    assert verdict["relationships"].junk == "instruction_echo"
    assert verdict["You should be proud. What made you pick up pottery?"].copy_of_message
    assert m.entries_supported == 2 and m.fact_support == pytest.approx(2 / 6)
    assert (m.fragments, m.copies, m.junk_entries, m.junk_narratives) == (2, 1, 1, 1)
    assert m.junk_reasons == {"entry:instruction_echo": 1, "narrative:instruction_echo": 1}
    first = audit.narratives[0]
    assert first.supported == [True, False]  # the moon trip is not in the messages
    assert m.narrative_sentences == 3 and m.sentences_supported == 1
    assert m.gold_located == 9 and 1 <= m.gold_covered <= 2  # ep0 states the bowls (and the class)
    assert m.episodes_per_session == 2 and m.messages_per_episode == 9.5 and m.facts_per_episode == 3
    store.close()


def test_aggregate_pools_counts_and_the_table_and_metrics_show_them(tmp_path, session1):
    store = _store(tmp_path, session1)
    row = mq.audit_memory(store, session1, _matcher()).metrics
    other = row.model_copy(update={"sample_id": "other", "gold": 1, "gold_matched": 1})
    agg = mq.aggregate([row, other])
    assert agg.gold == 10 and agg.fact_recall == pytest.approx(3 / 10)
    assert agg.junk_reasons["entry:instruction_echo"] == 2
    q = mq.MemoryQuality(system="nemori", conversations=[row, other], aggregate=agg)
    table = mq.memory_table([q])
    assert "fact recall" in table and "all" in table and "22.2" in table and "30.0" in table
    summary = {"memory": {"systems": {"nemori": q.model_dump()}, "caption": "c", "table": table}}
    metrics = mq.memory_metrics(summary["memory"])
    assert metrics["memory.fact_recall"] == pytest.approx(0.3) and metrics["memory.nemori.junk_entries"] == 2
    assert "fact_support" in json.dumps(summary) and mq.memory_summary_text(summary["memory"]).startswith("\nMemory (c)")
    store.close()


def test_memory_report_records_the_table(tmp_path, session1):
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.eval.systems import SYSTEMS
    from nemori_dspy.memory import Memory

    store = _store(tmp_path, session1)
    memory = Memory(store, HashingEmbedder(64), NemoriSettings())

    class Provider:
        def memory(self, system):
            return memory

    report = mq.memory_report(Provider(), [session1], [SYSTEMS["nemori"], SYSTEMS["nemori-no-consolidation"],
                                                       SYSTEMS["no-memory"]])
    assert list(report["systems"]) == ["nemori", "nemori-no-consolidation"]
    assert "precision" in report["caption"] and "hashing-64" in report["caption"]
    tables = tmp_path / "tables.md"
    tables.write_text("## Scores\n")
    assert mq.record_memory({"memory": report}, tables) is report
    assert "## Memory (" in tables.read_text() and "nemori-no-consolidation" in tables.read_text()
    assert mq.record_memory({}, tables) is None
    no_gold = session1.model_copy(update={"observations": []})
    assert mq.memory_report(Provider(), [no_gold], [SYSTEMS["nemori"]]) is None
    store.close()


def test_inspect_prints_metrics_narratives_and_facts(tmp_path, session1, capsys):
    _store(tmp_path, session1).close()
    code = mq.main(["inspect", "--db", str(tmp_path / "m.sqlite3"), "--data", str(SYNTHETIC_MINI),
                    "--conversations", USER, "--sessions", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "fact recall" in out and "cue 0" in out and "Elias flew to the moon." in out
    assert "JUNK:instruction_echo" in out and "FRAGMENT" in out and "COPY" in out and "= gold:" in out
    assert mq.main(["inspect", "--db", str(tmp_path / "none.sqlite3"), "--data", str(SYNTHETIC_MINI),
                    "--conversations", USER]) == 2


def test_a_fact_crediting_the_wrong_speaker_is_counted_misattributed(tmp_path, session1):
    store = _store(tmp_path, session1)
    vec = HashingEmbedder(64).embed(["x"])[0].tolist()
    right = "Elias goes swimming at the lake pool three mornings a week."  # D1:11 is Elias's: right speaker
    swapped = "Noor goes swimming at the lake pool three mornings a week."  # Noor never said it
    store.commit_distillation(USER, "ep1", [SemanticEntry(id=f"x{i}", user_id=USER, text=t, vector=vec,
                                                          source_episode_ids=["ep1"]) for i, t in
                                            enumerate([right, swapped])], [])
    audit = mq.audit_memory(store, session1, _matcher(), support=_support())
    verdict = {f.text: f for f in audit.facts}
    assert not verdict[right].misattributed and verdict[swapped].misattributed
    assert verdict[right].supported  # Elias's own message states it
    assert not verdict[swapped].supported and not verdict[swapped].counts_as_support  # no unit is about Noor
    assert audit.metrics.misattributed == 1 and "misattributed" in mq.memory_table(
        [mq.MemoryQuality(system="nemori", conversations=[audit.metrics], aggregate=audit.metrics)])
    store.close()


def test_a_narrative_sentence_crediting_the_wrong_speaker_is_not_faithful(tmp_path, session1):
    """"Elias made four lopsided bowls" restates Noor's own D1:3; a window holding both speakers' lines matches it,
    but the speaker check marks it misattributed and unsupported."""
    store = _narrative_store(tmp_path, session1, [
        "Noor went to her first pottery class. Elias made four lopsided bowls and one of them holds water."])
    (verdict,) = mq.audit_memory(store, session1, _matcher()).narratives
    assert verdict.misattributed == [False, True] and verdict.supported[1] is False
    store.close()


def test_a_seed_demo_fact_is_counted_as_junk(tmp_path, session1):
    store = _store(tmp_path, session1)
    vec = HashingEmbedder(64).embed(["x"])[0].tolist()
    echo = "Priya is starting a pottery class in April 2022."  # the seed demo's, not synth-1's
    store.commit_distillation(USER, "ep1", [SemanticEntry(id="echo", user_id=USER, text=echo, vector=vec,
                                                          source_episode_ids=["ep1"])], [])
    audit = mq.audit_memory(store, session1, _matcher())
    assert {f.text: f for f in audit.facts}[echo].junk == "demo_echo"
    assert audit.metrics.junk_reasons.get("entry:demo_echo") == 1
    store.close()


def test_an_attributed_quote_is_no_copy_and_counts_as_support(tmp_path, session1):
    from nemori_dspy.insight_rules import attributed_fact

    store = _store(tmp_path, session1)
    line = next(m for m in session1.messages if m.id == "D1:15")
    quote = attributed_fact(line.speaker, f"{line.timestamp:%Y-%m-%d}", line.content)
    vec = HashingEmbedder(64).embed(["x"])[0].tolist()
    store.commit_distillation(USER, "ep1", [SemanticEntry(id="q", user_id=USER, text=quote, vector=vec,
                                                          source_episode_ids=["ep1"])], [])
    audit = mq.audit_memory(store, session1, _matcher())
    verdict = {f.text: f for f in audit.facts}[quote]
    assert verdict.attributed and not verdict.copy_of_message and verdict.counts_as_support
    assert audit.metrics.attributed == 1 and audit.metrics.copies == 1  # the bare copy is still a copy
    store.close()


def test_recall_pairs_line_up_the_same_gold_observations_of_two_memories(tmp_path, session1):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    store_a, store_b = _store(a_dir, session1), _store(b_dir, session1)
    store_b.commit_distillation(USER, "ep1", [], ["ep0-0"])  # B lost the boat fact
    a = [mq.audit_memory(store_a, session1, _matcher(), support=_support())]
    b = [mq.audit_memory(store_b, session1, _matcher(), support=_support())]
    pairs = mq.recall_pairs(a, b)
    xa, xb = pairs["fact_recall"]
    assert len(xa) == len(xb) == 9 and sum(xa) == 2 and sum(xb) == 1
    boat = {f.text: f.gold for f in a[0].facts}["Elias built his first boat, a small rowing boat, in 2019."]
    assert [i for i in range(9) if xa[i] and not xb[i]] == boat
    assert pairs["narrative_coverage"][0] == pairs["narrative_coverage"][1]
    other = session1.model_copy(update={"observations": []})
    with pytest.raises(ValueError, match="same gold observations"):
        mq.recall_pairs(a, [mq.audit_memory(store_b, other, _matcher(), support=_support())])
    store_a.close(), store_b.close()


def test_compare_prints_both_tables_and_the_paired_difference(tmp_path, session1, capsys):
    (tmp_path / "b").mkdir()
    _store(tmp_path, session1).close()
    _store(tmp_path / "b", session1).close()
    code = mq.main(["compare", "--db", str(tmp_path / "m.sqlite3"), "--vs", str(tmp_path / "b" / "m.sqlite3"),
                    "--data", str(SYNTHETIC_MINI), "--conversations", USER, "--sessions", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "fact_recall: B−A +0.0" in out and "n=9" in out and "narrative_coverage" in out
