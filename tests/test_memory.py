"""``Memory`` facade end to end: ScriptedLM (real DSPy ChatAdapter) + HashingEmbedder + SQLiteStore."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta
from pathlib import Path

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.errors import InvalidInputError, NotFoundError, UnknownUserError
from nemori_dspy.memory import AddResult, Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import AnswerResult, DeleteMessageResult
from nemori_dspy.usage import UsageLedger

from .fakes import ScriptedLM, chat_reply, default_responders

T0 = datetime(2023, 5, 7, 13, 0)


def exchange(n: int, with_ids: bool = True, prefix: str = "d") -> list[dict]:
    topics = ["hiking in the alps", "a new puppy called Rex", "the pottery class", "moving to Lisbon"]
    return [{"speaker": "Alice" if i % 2 == 0 else "Bob",
             "content": f"Let's talk about {topics[i % len(topics)]} (line {i})",
             "timestamp": (T0 + timedelta(minutes=i)).isoformat(),
             **({"id": f"{prefix}{i}"} if with_ids else {})} for i in range(n)]


@pytest.fixture
def lm():
    scripted = ScriptedLM(default_responders())
    with dspy.context(lm=scripted, adapter=dspy.ChatAdapter()):
        yield scripted


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def make_memory(db: Path, lm):
    opened: list[SQLiteStore] = []

    def make(window_size: int = 4, **kw) -> Memory:
        store = SQLiteStore(db)
        opened.append(store)
        return Memory(store, HashingEmbedder(64), NemoriSettings(window_size=window_size, **kw))

    yield make
    for s in opened:
        s.close()


def assigned_ids(mem: Memory, user: str) -> list[str]:
    """Every message id held by the user's live episodes (with repeats, if any)."""
    return [mid for ep in mem.list_episodes(user) for mid in ep.message_ids]


# --------------------------------------------------------------------------- durability
def test_buffered_messages_survive_restart(make_memory):
    mem = make_memory(window_size=20)
    msgs = exchange(7)
    res = mem.add_messages("alice", msgs)
    assert res.accepted == 7 and res.duplicates == 0 and res.pending == 7
    assert res.report is not None and res.report.windows == 0  # partial window stays buffered
    assert mem.status("alice").episodes == 0
    mem.store.close()
    del mem, res

    mem2 = make_memory(window_size=20)  # "restart": new store object + new Memory on the same file
    assert mem2.status("alice").pending == 7
    report = mem2.flush("alice")
    assert report.windows == 1 and not report.parked
    got = assigned_ids(mem2, "alice")
    assert sorted(got) == sorted(m["id"] for m in msgs)  # all 7, each in exactly one episode
    assert len(got) == len(set(got)) == 7
    st = mem2.status("alice")
    assert st.pending == 0 and st.messages == 7
    # the episodes carry the original raw messages
    contents = {m.content for ep in mem2.list_episodes("alice") for m in ep.messages}
    assert contents == {m["content"] for m in msgs}


@pytest.mark.parametrize("with_ids", [True, False], ids=["with-ids", "content-hash"])
def test_reingesting_same_exchange_is_a_noop(make_memory, with_ids):
    mem = make_memory(window_size=4)
    msgs = exchange(6, with_ids=with_ids)
    first = mem.add_messages("bob", msgs)
    assert first.accepted == 6 and first.duplicates == 0
    mem.flush("bob")
    before = mem.status("bob")
    assert before.episodes > 0 and before.semantic > 0 and before.pending == 0

    second = mem.add_messages("bob", exchange(6, with_ids=with_ids))
    assert second.accepted == 0 and second.duplicates == 6
    mem.flush("bob")
    after = mem.status("bob")
    for key in ("messages", "pending", "episodes", "superseded_episodes", "semantic", "to_distill"):
        assert getattr(after, key) == getattr(before, key), key


# --------------------------------------------------------------------------- input errors
GOOD = {"speaker": "Alice", "content": "hi there", "timestamp": "2023-05-07T13:00:00"}


@pytest.mark.parametrize("bad, field", [
    ({**GOOD, "content": ""}, "messages[0].content"),
    ({**GOOD, "content": "   \n "}, "messages[0].content"),
    ({**GOOD, "timestamp": "not a date at all"}, "messages[0].timestamp"),
    ({**GOOD, "timestamp": ""}, "messages[0].timestamp"),
    ({k: v for k, v in GOOD.items() if k != "speaker"}, "messages[0].speaker"),
    ({k: v for k, v in GOOD.items() if k != "timestamp"}, "messages[0].timestamp"),
], ids=["empty-content", "blank-content", "bad-timestamp", "empty-timestamp", "no-speaker", "no-timestamp"])
def test_bad_message_fields_are_named(make_memory, bad, field):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("carol", [bad])
    assert exc.value.field == field
    assert field in str(exc.value) and str(exc.value).count("Fix:") == 1
    assert not mem.store.user_exists("carol")  # nothing was stored
    assert mem.status("carol").known is False


def test_bad_message_in_a_batch_stores_nothing(make_memory):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("carol", [GOOD, {**GOOD, "content": "ok"}, {**GOOD, "timestamp": "32/13/99999 xx"}])
    assert "messages[2].timestamp" in str(exc.value)
    assert not mem.store.user_exists("carol")


@pytest.mark.parametrize("not_a_list", ["hello", b"bytes", GOOD, None, 42],
                         ids=["str", "bytes", "dict", "None", "int"])
def test_messages_must_be_a_list(make_memory, not_a_list):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("carol", not_a_list)
    assert "messages" in str(exc.value)


def test_non_dict_message_item_is_named(make_memory):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("carol", [GOOD, "just a string"])
    assert "messages[1]" in str(exc.value)


@pytest.mark.parametrize("user_id", ["", "a" * 10000, "x\ny", "alice\n", "tab\there", "nul\x00", None, 123],
                         ids=["empty", "10k-chars", "newline", "trailing-newline", "tab", "nul", "None", "int"])
def test_invalid_user_ids_rejected(make_memory, user_id):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages(user_id, [GOOD])
    assert exc.value.field == "user_id" and "user_id" in str(exc.value)
    assert len(str(exc.value)) < 500  # a 10k-char id is not echoed in full
    for call in (lambda: mem.flush(user_id), lambda: mem.search(user_id, "hi"),
                 lambda: mem.answer(user_id, "hi")):
        with pytest.raises(InvalidInputError):
            call()
    assert mem.store.list_users() == []


WEIRD = ["../../etc/passwd", "a b/c", "DROP TABLE messages;", "robert'); DROP TABLE users;--", "ünïcødé 用户"]


def test_odd_user_ids_are_stored_as_inert_strings(make_memory, db: Path, tmp_path: Path):
    mem = make_memory(window_size=4)
    mem.add_messages("bystander", exchange(4, prefix="b"))
    mem.flush("bystander")
    bystander = mem.status("bystander")
    files_before = sorted(p.name for p in tmp_path.iterdir())

    for i, uid in enumerate(WEIRD):
        msgs = [{**m, "content": f"{uid} says {m['content']}"} for m in exchange(3, prefix=f"w{i}-")]
        assert mem.add_messages(uid, msgs).accepted == 3
        mem.flush(uid)
    for i, uid in enumerate(WEIRD):
        eps = mem.list_episodes(uid)
        assert eps and all(ep.user_id == uid for ep in eps)
        assert sorted(assigned_ids(mem, uid)) == [f"w{i}-{j}" for j in range(3)]
        assert all(m.content.startswith(f"{uid} says") for ep in eps for m in ep.messages)
        assert mem.search(uid, "hiking").episodes  # searchable under its own id

    assert set(WEIRD) | {"bystander"} == set(mem.store.list_users())
    assert mem.status("bystander").model_copy(update={"counters": {}}) == bystander.model_copy(update={"counters": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before  # no path built from an id
    # the tables survived "DROP TABLE": a new store on the same file still sees everything
    fresh = SQLiteStore(db)
    try:
        assert fresh.stats("DROP TABLE messages;")["messages"] == 3
        assert fresh.stats("bystander")["messages"] == 4
    finally:
        fresh.close()


def test_unknown_user_errors_only_where_the_call_writes_or_deletes(make_memory):
    mem = make_memory()
    mem.add_messages("known", [GOOD])
    for call in (lambda: mem.flush("ghost"), lambda: mem.delete_user("ghost"),
                 lambda: mem.delete_message("ghost", "m1"), lambda: mem.delete_episode("ghost", "ep_x"),
                 lambda: mem.delete_semantic("ghost", "s_x")):
        with pytest.raises(UnknownUserError) as exc:
            call()
        assert "ghost" in str(exc.value)
    # reads of a user with no memory are empty results
    res = mem.search("ghost", "anything")
    assert res.episodes == [] and res.semantic == []
    assert mem.search("ghost", "anything", metadata={"session": "s1"}).episodes == []
    ans = mem.answer("ghost", "what?")
    assert ans.context == "" and ans.retrieved.episodes == [] and ans.answer == "I don't know"
    st = mem.status("ghost")
    assert st.known is False and st.messages == 0 and st.pending == 0
    assert mem.list_episodes("ghost") == [] and mem.list_semantic("ghost") == []
    with pytest.raises(NotFoundError):
        mem.get_episode("ghost", "ep_x")
    assert not mem.store.user_exists("ghost")  # no read created the user


def test_empty_query_and_question_rejected(make_memory):
    mem = make_memory()
    mem.add_messages("dave", [GOOD])
    with pytest.raises(InvalidInputError, match="query"):
        mem.search("dave", "  ")
    with pytest.raises(InvalidInputError, match="question"):
        mem.answer("dave", "")


# --------------------------------------------------------------------------- delete
def test_delete_user_removes_everything_derived(make_memory):
    mem = make_memory(window_size=4)
    for uid, prefix in (("erin", "e"), ("frank", "f")):
        mem.add_messages(uid, exchange(6, prefix=prefix))
        mem.flush(uid)
    frank = mem.status("frank")
    assert mem.status("erin").semantic > 0

    mem.delete_user("erin")
    with pytest.raises(UnknownUserError):
        mem.delete_user("erin")
    assert mem.list_episodes("erin") == []
    assert mem.search("erin", "hiking").episodes == []
    assert not mem.store.user_exists("erin")
    assert all(v == 0 for v in mem.store.stats("erin").values())
    assert mem.store.list_episodes("erin") == [] and mem.store.list_semantic("erin") == []

    assert mem.status("frank").model_copy(update={"counters": {}}) == frank.model_copy(update={"counters": {}})
    assert mem.search("frank", "hiking").episodes
    # the deleted user can start over from scratch
    assert mem.add_messages("erin", exchange(2, prefix="e")).accepted == 2


# --------------------------------------------------------------------------- delete vs forget a fact
def test_delete_semantic_leaves_the_fact_in_its_episodes_and_forget_removes_it(make_memory):
    mem = make_memory(window_size=4)
    mem.add_messages("ivy", exchange(4, prefix="a"))     # one window: puppy Rex among the topics
    mem.flush("ivy")
    mem.add_messages("ivy", [{"speaker": "Alice", "content": "Unrelated: the weather is fine", "id": "w1",
                              "timestamp": (T0 + timedelta(days=3)).isoformat()}])
    mem.flush("ivy")
    rex = mem.list_semantic("ivy")[0]               # a fact of the first window's episode
    question = "What is the puppy called?"
    before = mem.pipeline.response.context("ivy", question).context
    assert "Rex" in before
    sources = mem.delete_semantic("ivy", rex.id)
    assert sources == rex.source_episode_ids and sources
    assert "Rex" in mem.pipeline.response.context("ivy", question).context   # documented: episodes still hold it
    other = next(f for f in mem.list_semantic("ivy") if set(f.source_episode_ids) & set(sources))
    out = mem.forget("ivy", other.id)
    assert set(sources) <= set(out.episodes) and {"a0", "a1", "a2", "a3"} <= set(out.messages)
    after = mem.pipeline.response.context("ivy", question).context
    assert "Rex" not in after and "puppy" not in after
    assert [m.id for ep in mem.list_episodes("ivy") for m in ep.messages] == ["w1"]
    with pytest.raises(NotFoundError):
        mem.forget("ivy", other.id)
    with pytest.raises(UnknownUserError):
        mem.forget("nobody", other.id)
    with pytest.raises(InvalidInputError, match="entry_id"):
        mem.forget("ivy", "")


# --------------------------------------------------------------------------- answer / search
def test_update_semantic_and_the_history_that_joins_merged_versions(make_memory):
    from nemori_dspy.types import SemanticEntry

    mem = make_memory()
    mem.add_messages("ida", exchange(4))
    mem.flush("ida")
    a, b = mem.list_semantic("ida")[:2]
    merged = SemanticEntry(id="sem_merged", user_id="ida", text="Alice hikes and has a puppy.",
                           vector=mem.resources.embed("Alice hikes and has a puppy."), origin="merge",
                           source_episode_ids=sorted({*a.source_episode_ids, *b.source_episode_ids}),
                           supersedes=[a.id, b.id])
    mem.store.commit_distillation("ida", a.source_episode_ids[0], [merged], [a.id, b.id])
    fixed = mem.update_semantic("ida", "sem_merged", "  Alice hikes and has a puppy called Rex.  ",
                                event_end="2023-05-08T10:00:00")
    assert fixed.text == "Alice hikes and has a puppy called Rex." and fixed.origin == "user_update"
    assert fixed.event_start == fixed.event_end == datetime(2023, 5, 8, 10, 0)      # one bound alone sets both
    assert [e.id for e in mem.list_semantic("ida")].count(fixed.id) == 1
    assert mem.search("ida", "puppy called Rex").semantic[0].entry.id == fixed.id
    for asked in (a.id, "sem_merged", fixed.id):                    # from any version, the whole lineage
        hist = mem.semantic_history("ida", asked)
        assert {v.id for v in hist} == {a.id, b.id, "sem_merged", fixed.id} and hist[-1].id == fixed.id
    by_id = {v.id: v for v in hist}
    assert by_id[a.id].retired_decision == by_id[b.id].retired_decision == "merge"
    assert by_id[a.id].retired_by == "sem_merged" and by_id["sem_merged"].retired_decision == "user_update"
    assert by_id["sem_merged"].retired_by == fixed.id and by_id[fixed.id].live and not by_id[a.id].live
    with pytest.raises(NotFoundError):
        mem.update_semantic("ida", a.id, "a retired version")
    with pytest.raises(NotFoundError):
        mem.semantic_history("ida", "sem_nope")
    with pytest.raises(UnknownUserError):
        mem.update_semantic("nobody", fixed.id, "x")
    for text in ("", "   ", None):
        with pytest.raises(InvalidInputError, match="text"):
            mem.update_semantic("ida", fixed.id, text)
    with pytest.raises(InvalidInputError, match="event_start"):
        mem.update_semantic("ida", fixed.id, "x", event_start="not a date")
    assert mem.get_semantic("ida", fixed.id).text == fixed.text          # nothing changed by the refusals


def test_answer_uses_memory_and_reports_usage(make_memory, lm):
    mem = make_memory(window_size=4)
    mem.add_messages("gina", exchange(8))
    mem.flush("gina")
    res = mem.answer("gina", "When did Alice talk about the puppy?")
    assert isinstance(res, AnswerResult)
    assert res.mode == "memory" and res.context.strip()
    assert res.answer == "7 May 2023"  # the scripted answer when a context is given
    assert res.retrieved.episodes
    assert res.usage.calls >= 1
    assert lm.calls.get("AnswerQuestion", 0) >= 1


def test_answer_without_memory_has_empty_context(make_memory):
    mem = make_memory(window_size=4)
    mem.add_messages("gina", exchange(8))
    mem.flush("gina")
    res = mem.answer("gina", "When did Alice talk about the puppy?", use_memory=False)
    assert res.mode == "no-memory" and res.context == ""
    assert res.answer == "I don't know"
    assert res.retrieved.episodes == [] and res.retrieved.semantic == []


def test_search_results_ordered_by_decreasing_score(make_memory):
    mem = make_memory(window_size=4)
    mem.add_messages("hana", exchange(12))
    mem.flush("hana")
    res = mem.search("hana", "puppy called Rex")
    assert len(res.episodes) >= 2 and res.semantic
    for hits in (res.episodes, res.semantic):
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)
    assert all(h.episode.user_id == "hana" for h in res.episodes)
    assert len(mem.search("hana", "puppy", top_k=1, semantic_top_k=1).episodes) == 1


# --------------------------------------------------------------------------- concurrency
def test_concurrent_adds_across_users(db: Path):
    store = SQLiteStore(db)
    mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=50))
    errors: list[BaseException] = []
    start = threading.Barrier(10)

    def worker(t: int) -> None:
        user = f"user{t % 2}"
        try:
            start.wait()
            for i in range(50):
                r = mem.add_messages(user, [{"speaker": f"s{t}", "content": f"thread {t} message {i}",
                                             "timestamp": (T0 + timedelta(seconds=t * 100 + i)).isoformat(),
                                             "id": f"t{t}-{i}"}], process=False)
                assert r.accepted == 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert not any(th.is_alive() for th in threads)

    lm = ScriptedLM(default_responders(groups_of=25))  # bigger episodes: fewer scripted calls
    for u in ("user0", "user1"):
        assert mem.status(u).messages == 250 and mem.status(u).pending == 250
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
            report = mem.flush(u)
        assert not report.parked
        st = mem.status(u)
        assert st.messages == 250 and st.pending == 0
        got = assigned_ids(mem, u)
        parity = int(u[-1])
        expected = {f"t{t}-{i}" for t in range(10) if t % 2 == parity for i in range(50)}
        assert len(got) == len(set(got)) == 250 and set(got) == expected  # only their own, each once
    store.close()


def test_asyncio_ingestion_many_users_each_sees_only_their_own(db: Path):
    """Case 9 from asyncio: 10 tasks x 50 messages over 2 users through ``aadd_messages``."""
    store = SQLiteStore(db)
    mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=50))

    async def task(t: int) -> int:
        n = 0
        for i in range(50):
            r = await mem.aadd_messages(f"user{t % 2}", [{
                "speaker": f"s{t}", "content": f"task {t} message {i}", "id": f"a{t}-{i}",
                "timestamp": (T0 + timedelta(seconds=t * 100 + i)).isoformat()}], process=False)
            n += r.accepted
        return n

    async def main() -> list[int]:
        return await asyncio.gather(*(task(t) for t in range(10)))

    assert asyncio.run(main()) == [50] * 10
    lm = ScriptedLM(default_responders(groups_of=25))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        reports = asyncio.run(_flush_both(mem))
    assert not any(r.parked for r in reports)
    for u in ("user0", "user1"):
        got = assigned_ids(mem, u)
        parity = int(u[-1])
        assert sorted(got) == sorted(f"a{t}-{i}" for t in range(10) if t % 2 == parity for i in range(50))
        hits = asyncio.run(mem.asearch(u, "task message", top_k=3))
        assert hits.episodes and all(h.episode.user_id == u for h in hits.episodes)
    store.close()


async def _flush_both(mem: Memory):
    return await asyncio.gather(mem.aflush("user0"), mem.aflush("user1"))


# --------------------------------------------------------------------------- ids, metadata, delete one message
def test_add_messages_returns_stored_and_duplicate_ids(make_memory):
    mem = make_memory(window_size=20)
    first = mem.add_messages("ivy", exchange(3))
    assert first.ids == ["d0", "d1", "d2"] and first.duplicate_ids == []
    again = mem.add_messages("ivy", exchange(4) + [exchange(4)[3]])  # d0-d2 stored, d3 new, d3 repeated
    assert again.ids == ["d3"] and again.duplicate_ids == ["d0", "d1", "d2", "d3"]
    assert (again.accepted, again.duplicates, again.pending) == (1, 4, 4)
    assert AddResult.model_validate_json(again.model_dump_json()) == again  # a typed record, JSON both ways
    no_ids = mem.add_messages("ivy", exchange(2, with_ids=False))
    assert len(no_ids.ids) == 2 and all(i.startswith("h") for i in no_ids.ids)
    assert mem.add_messages("ivy", exchange(2, with_ids=False)).duplicate_ids == no_ids.ids


def test_metadata_is_stored_returned_and_filters_search(make_memory):
    mem = make_memory(window_size=4)
    msgs = exchange(8)
    for i, m in enumerate(msgs):
        m["metadata"] = {"session": "s1" if i < 4 else "s2", "turn": i, "flag": i == 5, "score": 0.5}
    mem.add_messages("jo", msgs)
    mem.flush("jo")
    stored = {m.id: m.metadata for ep in mem.list_episodes("jo") for m in ep.messages}
    assert stored["d5"] == {"session": "s2", "turn": 5, "flag": True, "score": 0.5}
    assert isinstance(stored["d5"]["flag"], bool) and isinstance(stored["d5"]["turn"], int)

    everything = mem.search("jo", "puppy")
    s1 = mem.search("jo", "puppy", metadata={"session": "s1"})
    assert s1.episodes and len(s1.episodes) < len(everything.episodes)
    assert all(any(m.metadata.get("session") == "s1" for m in h.episode.messages) for h in s1.episodes)
    s1_eps = {h.episode.id for h in s1.episodes}
    assert s1.semantic and all(set(h.entry.source_episode_ids) & s1_eps for h in s1.semantic)
    flagged = mem.search("jo", "puppy", metadata={"flag": True})
    assert [m.id for h in flagged.episodes for m in h.episode.messages if m.metadata["flag"]] == ["d5"]
    # JSON types are kept apart: True is not 1, "5" is not 5
    assert mem.search("jo", "puppy", metadata={"flag": 1}).episodes == []
    assert mem.search("jo", "puppy", metadata={"turn": "5"}).episodes == []
    assert mem.search("jo", "puppy", metadata={"turn": 5.0}).episodes  # 5 == 5.0
    assert mem.search("jo", "puppy", metadata={"session": "nope"}).episodes == []


@pytest.mark.parametrize("meta, field", [
    ({"a": [1]}, "messages[0].metadata.a"),
    ({"a": {"b": 1}}, "messages[0].metadata.a"),
    ({"a": float("nan")}, "messages[0].metadata.a"),
    ({"a": "x" * 2000}, "messages[0].metadata.a"),
    ({f"k{i}": i for i in range(40)}, "messages[0].metadata"),
    ({"": 1}, "messages[0].metadata"),
    ("session=s1", "messages[0].metadata"),
], ids=["list", "nested", "nan", "long-value", "too-many-keys", "empty-key", "not-an-object"])
def test_bad_metadata_is_named(make_memory, meta, field):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("kim", [{**GOOD, "metadata": meta}])
    assert exc.value.field == field and "Fix:" in str(exc.value)
    assert not mem.store.user_exists("kim")
    with pytest.raises(InvalidInputError):
        mem.search("kim", "x", metadata={"a": [1]})


def test_delete_message_removes_only_what_was_derived_from_it(make_memory, lm):
    mem = make_memory(window_size=4)
    mem.add_messages("lee", exchange(8))   # windows of 4, groups of 5 → one episode per window
    mem.flush("lee")
    eps = mem.list_episodes("lee")
    assert len(eps) == 2
    target, other = (eps[0], eps[1]) if "d1" in eps[0].message_ids else (eps[1], eps[0])
    sem_before = {e.id: e for e in mem.list_semantic("lee")}
    only_target = {i for i, e in sem_before.items() if set(e.source_episode_ids) == {target.id}}
    assert only_target

    out = mem.delete_message("lee", "d1")
    assert out.episodes == [target.id]
    assert set(out.semantic) == only_target
    assert sorted(out.requeued) == sorted(set(target.message_ids) - {"d1"})
    assert [e.id for e in mem.list_episodes("lee")] == [other.id]           # the other episode is untouched
    assert set(e.id for e in mem.list_semantic("lee")) == set(sem_before) - only_target
    st = mem.status("lee")
    assert st.messages == 7 and st.pending == 3                      # re-buffered, not lost
    with pytest.raises(NotFoundError):
        mem.delete_message("lee", "d1")

    mem.flush("lee")                                                        # re-formed from what is left
    held = assigned_ids(mem, "lee")
    assert sorted(held) == sorted(f"d{i}" for i in range(8) if i != 1) and len(held) == len(set(held))
    assert all("(line 1)" not in m.content for ep in mem.list_episodes("lee") for m in ep.messages)
    assert mem.status("lee").pending == 0
    # a pending message is simply removed
    mem.add_messages("lee", exchange(1, prefix="p"))
    assert mem.delete_message("lee", "p0") == DeleteMessageResult()
    assert mem.status("lee").messages == 7


def test_delete_message_also_removes_superseded_versions_holding_it(make_memory, lm):
    lm.responders["SelectContinuation"] = lambda i: chat_reply(choice=1)  # always merge into the top candidate
    mem = make_memory(window_size=2)
    mem.add_messages("max", exchange(4))
    mem.flush("max")
    assert mem.status("max").superseded_episodes >= 1
    live = mem.list_episodes("max")
    assert len(live) == 1 and sorted(live[0].message_ids) == ["d0", "d1", "d2", "d3"]
    out = mem.delete_message("max", "d0")
    assert live[0].id in out.episodes and len(out.episodes) >= 2   # the merged episode and the one it absorbed
    st = mem.status("max")
    assert st.episodes == 0 and st.pending == 3
    remaining = mem.store._conn().execute("SELECT message_ids FROM episodes WHERE user_id='max'").fetchall()
    assert all('"d0"' not in r[0] for r in remaining)                     # no copy of d0 left anywhere


def test_v1_sqlite_file_is_migrated_and_readable(tmp_path: Path, lm):
    import sqlite3

    path = tmp_path / "old.db"
    v1 = sqlite3.connect(path)
    v1.executescript(V1_SCHEMA)
    v1.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    v1.execute("INSERT INTO users (user_id) VALUES ('old')")
    v1.execute("INSERT INTO messages (user_id, id, seq, speaker, content, ts) VALUES "
               "('old', 'o1', 1, 'Alice', 'hello from version 1', '2023-05-07T13:00:00')")
    v1.commit()
    v1.close()
    store = SQLiteStore(path)
    try:
        mem = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=4))
        assert [m.metadata for m in store.pending_messages("old")] == [{}]
        mem.add_messages("old", [{**GOOD, "id": "n1", "metadata": {"v": 2}}])
        assert [m.metadata for m in store.pending_messages("old")] == [{}, {"v": 2}]
        mem.flush("old")
        assert sorted(assigned_ids(mem, "old")) == ["n1", "o1"]
        assert store._conn().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "5"
    finally:
        store.close()
    SQLiteStore(path).close()  # reopening a migrated file is a no-op


#: The version-1 schema as the first release wrote it (before messages.metadata).
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE users (user_id TEXT PRIMARY KEY, generation INTEGER NOT NULL DEFAULT 0,
    next_window INTEGER NOT NULL DEFAULT 0, next_seq INTEGER NOT NULL DEFAULT 2);
CREATE TABLE messages (user_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
    speaker TEXT NOT NULL, content TEXT NOT NULL, ts TEXT NOT NULL, episode_id TEXT,
    processed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (user_id, id));
CREATE INDEX messages_pending ON messages (user_id, processed, seq);
CREATE TABLE episodes (user_id TEXT NOT NULL, id TEXT NOT NULL, cue TEXT NOT NULL,
    narrative TEXT NOT NULL, message_ids TEXT NOT NULL, start_ts TEXT NOT NULL, end_ts TEXT NOT NULL,
    vector BLOB NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL, window INTEGER NOT NULL,
    distilled INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user_id, id));
CREATE TABLE semantic (user_id TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL,
    vector BLOB NOT NULL, sources TEXT NOT NULL, supersedes TEXT NOT NULL, created_at TEXT NOT NULL,
    live INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user_id, id));
"""


# --------------------------------------------------------------------------- litellm embedder, dimension unknown
def _fake_litellm_embedding(dim: int):
    """A stand-in for ``litellm.embedding`` returning ``dim``-d vectors derived from each text."""
    from types import SimpleNamespace

    import numpy as np

    def embedding(input, **_kw):  # noqa: A002 - litellm's parameter name
        rows = [np.random.default_rng(sum(map(ord, t))).normal(size=dim).tolist() for t in input]
        return SimpleNamespace(data=[{"index": i, "embedding": r} for i, r in enumerate(rows)],
                               usage={"prompt_tokens": 1})

    return embedding


def test_a_store_made_with_a_litellm_embedder_reopens(db: Path, lm, monkeypatch):
    import litellm

    from nemori_dspy.embedders import LiteLLMEmbedder
    from nemori_dspy.errors import EmbedderMismatchError

    monkeypatch.setattr(litellm, "embedding", _fake_litellm_embedding(8))
    store = SQLiteStore(db)
    mem = Memory(store, LiteLLMEmbedder("openai/fake-embed"), NemoriSettings(window_size=4))
    mem.add_messages("u", exchange(4))
    assert mem.list_episodes("u")
    store.close()
    reopened = SQLiteStore(db)
    again = Memory(reopened, LiteLLMEmbedder("openai/fake-embed"), NemoriSettings(window_size=4))
    assert again.search("u", "puppy").episodes  # its vectors are comparable with the stored ones
    with pytest.raises(EmbedderMismatchError):
        Memory(reopened, LiteLLMEmbedder("openai/other-embed"), NemoriSettings())
    with pytest.raises(EmbedderMismatchError):
        Memory(reopened, LiteLLMEmbedder("openai/fake-embed", dimensions=16), NemoriSettings())
    with pytest.raises(EmbedderMismatchError):
        Memory(reopened, HashingEmbedder(8), NemoriSettings())
    reopened.close()


def test_a_store_that_recorded_dimension_none_opens_and_learns_it(db: Path, lm, monkeypatch):
    """Stores written before the fix recorded the dimension as the text 'None'."""
    import sqlite3

    import litellm

    from nemori_dspy.embedders import LiteLLMEmbedder

    SQLiteStore(db).close()
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO meta VALUES ('embedder', 'openai/fake-embed'), ('dim', 'None')")
    monkeypatch.setattr(litellm, "embedding", _fake_litellm_embedding(8))
    mem = Memory(SQLiteStore(db), LiteLLMEmbedder("openai/fake-embed"), NemoriSettings(window_size=4))
    mem.add_messages("u", exchange(4))
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT value FROM meta WHERE key='dim'").fetchone() == ("8",)


# ------------------------------------------------------------------ usage is per Memory, never process-wide
def _llm_calls(mem: Memory) -> int:
    u = mem.usage.total()
    return u.calls + u.cache_hits


def test_two_memories_in_one_process_have_separate_usage_and_counters(tmp_path, ledger):
    a_lm, b_lm = ScriptedLM(default_responders()), ScriptedLM(default_responders())
    a = Memory(SQLiteStore(tmp_path / "a.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
    b = Memory(SQLiteStore(tmp_path / "b.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
    with dspy.context(lm=a_lm, adapter=dspy.ChatAdapter()):
        a.add_messages("alice", exchange(20))
    assert b.status("bob").counters == {} and b.usage.snapshot() == {}  # b has made no call yet
    a_counters, a_calls = dict(a.usage.counters), _llm_calls(a)
    with dspy.context(lm=b_lm, adapter=dspy.ChatAdapter()):
        b.add_messages("bob", exchange(10))
        b.answer("bob", "Where is Alice moving?")
    assert _llm_calls(a) == sum(a_lm.calls.values()) and _llm_calls(b) == sum(b_lm.calls.values())
    assert a.status("alice").counters == a.usage.counters == a_counters and _llm_calls(a) == a_calls  # b left a alone
    assert b.status("bob").counters == b.usage.counters and 0 < b.usage.counters["evoke_calls"] < a_counters["evoke_calls"]
    assert b.usage.snapshot()["answer"].calls == 1 and "answer" not in a.usage.snapshot()
    assert a.usage.embedding_summary()["calls"] > 0 and b.usage.embedding_summary()["calls"] > 0
    # the test's ledger, active around both, holds their sum and nothing else
    t, both = ledger.total(), UsageLedger.merged([a.usage, b.usage]).total()
    assert (t.calls, t.cache_hits, t.input_tokens, t.output_tokens) == (
        both.calls, both.cache_hits, both.input_tokens, both.output_tokens)


def test_memories_in_concurrent_threads_and_async_calls_keep_their_own_ledger(tmp_path):
    mems = [Memory(SQLiteStore(tmp_path / f"{i}.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
            for i in range(2)]
    lms = [ScriptedLM(default_responders()) for _ in mems]
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        with dspy.context(lm=lms[i], adapter=dspy.ChatAdapter()):
            barrier.wait()
            mems[i].add_messages(f"u{i}", exchange(10 * (i + 1)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert [_llm_calls(m) for m in mems] == [sum(lm.calls.values()) for lm in lms]
    assert _llm_calls(mems[0]) < _llm_calls(mems[1])

    before = _llm_calls(mems[0])
    with dspy.context(lm=lms[0], adapter=dspy.ChatAdapter()):
        asyncio.run(mems[0].aanswer("u0", "What about the puppy?"))  # runs in a worker thread
    assert _llm_calls(mems[0]) == before + 1 and mems[0].usage.snapshot()["answer"].calls == 1
    assert "answer" not in mems[1].usage.snapshot()


def test_background_worker_threads_charge_the_memory(tmp_path):
    from nemori_dspy.apps.serving.worker import BackgroundProcessor

    lm = ScriptedLM(default_responders())
    mem = Memory(SQLiteStore(tmp_path / "w.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
    mem.add_messages("w", exchange(10), process=False)
    worker = BackgroundProcessor(mem, threads=1, lm=lm, adapter=dspy.ChatAdapter())
    worker.schedule("w")
    assert worker.wait_idle("w", timeout=60)
    worker.stop()
    assert sum(lm.calls.values()) > 0 and _llm_calls(mem) == sum(lm.calls.values())


# ------------------------------------------------------------------ one Resources per Memory
def test_a_memory_given_a_pipeline_uses_its_resources_not_a_second_set(tmp_path):
    from nemori_dspy.modules.pipeline import NemoriPipeline
    from nemori_dspy.modules.resources import Resources

    store, emb, s = SQLiteStore(tmp_path / "p.db"), HashingEmbedder(64), NemoriSettings(window_size=10)
    pipeline = NemoriPipeline(Resources(store, emb, s))
    mem = Memory(store, emb, s, pipeline=pipeline)
    assert mem.resources is pipeline.res and mem.settings is s
    assert Memory(store, emb, pipeline=pipeline).settings is s  # settings unset: the pipeline's


@pytest.mark.parametrize("other", ["store", "embedder", "settings"])
def test_a_pipeline_over_another_store_embedder_or_settings_is_refused(tmp_path, other):
    from nemori_dspy.modules.pipeline import NemoriPipeline
    from nemori_dspy.modules.resources import Resources

    store, emb, s = SQLiteStore(tmp_path / "p.db"), HashingEmbedder(64), NemoriSettings(window_size=10)
    pipeline = NemoriPipeline(Resources(store, emb, s))
    given = {"store": store, "embedder": emb, "settings": s}
    given[other] = {"store": lambda: SQLiteStore(tmp_path / "q.db"), "embedder": lambda: HashingEmbedder(64),
                    "settings": lambda: NemoriSettings(window_size=12)}[other]()
    with pytest.raises(InvalidInputError, match=f"pipeline.*another {other}|pipeline.*other settings"):
        Memory(given["store"], given["embedder"], given["settings"], pipeline=pipeline)


def test_a_programming_error_inside_a_stage_raises_through_memory_and_parks_nothing(memory, monkeypatch):
    class Broken(dspy.Module):
        def forward(self, **kwargs):
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    memory.pipeline.episodic.narrate.predict = Broken()
    with pytest.raises(TypeError, match="unsupported operand"):
        memory.add_messages("tina", exchange(10))
    st = memory.status("tina")
    assert st.parked == [] and st.pending == 10  # not parked as an LLM failure; the messages are kept
    assert "retries" not in st.counters and "parked_windows" not in st.counters
