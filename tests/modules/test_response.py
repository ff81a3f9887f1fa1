"""Response generation: retrieval order, context layout (k narratives, r raw episodes, m facts)."""

from __future__ import annotations

from datetime import datetime

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.modules.pipeline import stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.modules.response import ResponseGeneration
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, Message, SemanticEntry
from tests.fakes import ScriptedLM, TableEmbedder, default_responders, unit_vector


def _setup(tmp_path, **settings):
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    ts = datetime(2023, 5, 8, 13, 0)
    eps = []
    for i, deg in enumerate([60, 10, 35]):  # cosines to the query (0°): 0.5, 0.985, 0.819
        store.add_messages("u", [Message(speaker="A", content=f"raw message {i}", timestamp=ts, id=f"m{i}")])
        eps.append(Episode(id=f"e{i}", user_id="u", cue=f"cue {i}", narrative=f"narrative {i}", message_ids=[f"m{i}"],
                           start=ts, end=ts, vector=unit_vector(deg)))
    store.commit_window("u", 0, eps, [])
    store.commit_distillation("u", "e0", [SemanticEntry(id=f"s{i}", user_id="u", text=f"fact {i}", vector=unit_vector(d))
                                          for i, d in enumerate([50, 5])], [])
    s = NemoriSettings(**settings)
    return ResponseGeneration(Resources(store, TableEmbedder({"q?": [1, 0, 0]}), s), stage_factory(s))


def test_retrieval_orders_by_decreasing_cosine(tmp_path):
    res = _setup(tmp_path).retrieve("u", "q?")
    assert [s.episode.id for s in res.episodes] == ["e1", "e2", "e0"]
    assert [s.entry.id for s in res.semantic] == ["s1", "s0"]
    assert all(a.score >= b.score for a, b in zip(res.episodes, res.episodes[1:]))


def test_top_k_and_raw_messages_of_top_r_only(tmp_path):
    rg = _setup(tmp_path, episodes_top_k=2, semantic_top_k=1, raw_episodes_top_r=1)
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = rg(user_id="u", question="q?")
    ctx = pred.context
    assert "narrative 1" in ctx and "narrative 2" in ctx and "narrative 0" not in ctx
    assert "raw message 1" in ctx and "raw message 2" not in ctx
    assert "fact 1" in ctx and "fact 0" not in ctx
    assert ctx.index("narrative 1") < ctx.index("narrative 2")
    assert lm.prompts[-1][1]["question"] == "q?"


def test_no_memory_control_sends_empty_context(tmp_path):
    rg = _setup(tmp_path)
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = rg(user_id="u", question="q?", use_memory=False)
    assert pred.context == "" and not pred.retrieved.episodes


def test_a_given_context_is_what_p_ans_answers_on_and_nothing_is_retrieved(tmp_path):
    """The eval's non-memory systems answer through the same call: P_ans sees their context, no search runs."""
    rg = _setup(tmp_path)
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = rg(user_id="u", question="q?", context="Alice adopted a puppy on 7 May 2023.")
        plain = rg(user_id="u", question="q?")
    assert pred.context == "Alice adopted a puppy on 7 May 2023." and lm.prompts[-2][1]["context"] == pred.context
    assert not pred.retrieved.episodes and not pred.retrieved.semantic and pred.search_ms == 0.0
    assert pred.answer == pred.answer.strip() and plain.retrieved.episodes


def test_known_facts_show_event_dates_in_similarity_order_never_the_ingestion_date(tmp_path):
    """P_ans is told to prefer the most recent memory: facts carry *event* dates for that, and keep
    their similarity order (``facts_order="similarity"``, the paper's); an undated (older-store) fact is shown
    without a date, not with created_at."""
    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    written = datetime(2030, 1, 1, 12, 0)
    store.commit_distillation("u", "e0", [
        SemanticEntry(id="s-old", user_id="u", text="Caroline lives in Boston.", vector=unit_vector(5), created_at=written,
                      event_start=datetime(2023, 5, 8, 13, 0), event_end=datetime(2023, 5, 8, 14, 0)),
        SemanticEntry(id="s-new", user_id="u", text="Caroline moved to Denver.", vector=unit_vector(20), created_at=written,
                      event_start=datetime(2023, 5, 20, 9, 0), event_end=datetime(2023, 6, 2, 9, 0)),
        SemanticEntry(id="s-undated", user_id="u", text="Caroline likes hiking.", vector=unit_vector(30),
                      created_at=written)], [])
    s = NemoriSettings(facts_order="similarity")
    rg = ResponseGeneration(Resources(store, TableEmbedder({"q?": [1, 0, 0]}), s), stage_factory(s))
    lm = ScriptedLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = rg(user_id="u", question="q?")
    facts = pred.context.split("Known facts:\n", 1)[1].splitlines()
    assert facts == ["- (2023-05-08) Caroline lives in Boston.",
                     "- (2023-05-20 to 2023-06-02) Caroline moved to Denver.", "- Caroline likes hiking."]
    sent = lm.prompts[-1][1]["context"]
    assert "(2023-05-20 to 2023-06-02) Caroline moved to Denver." in sent and "2030-01-01" not in sent


def test_context_parts_are_switched_per_call_not_by_unused_constructor_flags():
    import inspect

    from nemori_dspy.modules.response import ResponseGeneration

    assert list(inspect.signature(ResponseGeneration.__init__).parameters) == ["self", "resources", "make"]
    assert {"include_episodes", "include_semantic", "include_raw"} <= set(
        inspect.signature(ResponseGeneration.context).parameters)


# --- answer_context_tokens: the context is capped by tokens, best-ranked items first
def test_answer_context_cap_admits_narratives_first_within_the_token_budget(tmp_path):
    from nemori_dspy.formatting import count_tokens

    full = _setup(tmp_path / "a").context("u", "q?")
    capped_rg = _setup(tmp_path / "b", answer_context_tokens=62)
    capped = capped_rg.context("u", "q?")
    assert count_tokens(capped.context) <= 62 < count_tokens(full.context)
    # narratives by rank first (e1 best, e2, ...), then raw messages and fact shares by rank
    assert "narrative 1" in capped.context and "narrative 2" in capped.context and "fact 1" in capped.context
    assert "raw message 1" not in capped.context  # e2's narrative went before e1's raw messages
    assert "narrative 0" not in capped.context  # the worst episode is the first to go
    assert [s.episode.id for s in capped.retrieved.episodes] == ["e1", "e2"]


def test_answer_context_cap_off_is_the_paper_context(tmp_path):
    full = _setup(tmp_path / "a").context("u", "q?").context
    assert _setup(tmp_path / "b", answer_context_tokens=100_000).context("u", "q?").context == full
    assert _setup(tmp_path / "c", answer_context_tokens="off").context("u", "q?").context == full


def test_facts_are_listed_oldest_first_so_the_newer_of_two_that_disagree_is_plain(tmp_path):
    """Issue 19: when facts disagree the answer context makes the newer one plain (facts_order, default)."""
    from nemori_dspy.formatting import CHRONOLOGICAL_FACTS_HEADER

    store = SQLiteStore(tmp_path / "m.db")
    store.check_embedder("table-3", 3)
    store.commit_distillation("u", "ep", [
        SemanticEntry(id="s-new", user_id="u", text="Caroline now lives in Denver.", vector=unit_vector(5),
                      event_start=datetime(2023, 7, 1), event_end=datetime(2023, 7, 1)),
        SemanticEntry(id="s-old", user_id="u", text="Caroline lives in Boston.", vector=unit_vector(20),
                      event_start=datetime(2023, 5, 8), event_end=datetime(2023, 5, 8))], [])
    contexts = {}
    for order in ("chronological", "similarity"):
        s = NemoriSettings(facts_order=order)
        rg = ResponseGeneration(Resources(store, TableEmbedder({"q?": [1, 0, 0]}), s), stage_factory(s))
        with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()):
            contexts[order] = rg(user_id="u", question="q?").context
    chrono = contexts["chronological"].split(CHRONOLOGICAL_FACTS_HEADER + "\n", 1)[1].splitlines()
    assert chrono == ["- (2023-05-08) Caroline lives in Boston.", "- (2023-07-01) Caroline now lives in Denver."]
    by_rank = contexts["similarity"].split("Known facts:\n", 1)[1].splitlines()
    assert by_rank[0] == "- (2023-07-01) Caroline now lives in Denver."
