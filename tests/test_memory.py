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
from nemori_dspy.errors import InvalidInputError, UnknownUserError
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import AnswerResult

from .fakes import ScriptedLM, default_responders

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
    assert mem.status("alice")["episodes"] == 0
    mem.store.close()
    del mem, res

    mem2 = make_memory(window_size=20)  # "restart": new store object + new Memory on the same file
    assert mem2.status("alice")["pending"] == 7
    report = mem2.flush("alice")
    assert report.windows == 1 and not report.parked
    got = assigned_ids(mem2, "alice")
    assert sorted(got) == sorted(m["id"] for m in msgs)  # all 7, each in exactly one episode
    assert len(got) == len(set(got)) == 7
    st = mem2.status("alice")
    assert st["pending"] == 0 and st["messages"] == 7
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
    assert before["episodes"] > 0 and before["semantic"] > 0 and before["pending"] == 0

    second = mem.add_messages("bob", exchange(6, with_ids=with_ids))
    assert second.accepted == 0 and second.duplicates == 6
    mem.flush("bob")
    after = mem.status("bob")
    for key in ("messages", "pending", "episodes", "superseded_episodes", "semantic", "to_distill"):
        assert after[key] == before[key], key


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
    with pytest.raises(UnknownUserError):  # nothing was stored
        mem.status("carol")


def test_bad_message_in_a_batch_stores_nothing(make_memory):
    mem = make_memory()
    with pytest.raises(InvalidInputError) as exc:
        mem.add_messages("carol", [GOOD, {**GOOD, "content": "ok"}, {**GOOD, "timestamp": "32/13/99999 xx"}])
    assert "messages[2].timestamp" in str(exc.value)
    with pytest.raises(UnknownUserError):
        mem.status("carol")


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
    assert mem.status("bystander") | {"counters": None} == bystander | {"counters": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before  # no path built from an id
    # the tables survived "DROP TABLE": a new store on the same file still sees everything
    fresh = SQLiteStore(db)
    try:
        assert fresh.stats("DROP TABLE messages;")["messages"] == 3
        assert fresh.stats("bystander")["messages"] == 4
    finally:
        fresh.close()


def test_unknown_user_errors(make_memory):
    mem = make_memory()
    mem.add_messages("known", [GOOD])
    for call in (lambda: mem.flush("ghost"), lambda: mem.search("ghost", "anything"),
                 lambda: mem.answer("ghost", "what?"), lambda: mem.status("ghost"),
                 lambda: mem.list_episodes("ghost"), lambda: mem.delete_user("ghost")):
        with pytest.raises(UnknownUserError) as exc:
            call()
        assert "ghost" in str(exc.value)
    assert not mem.store.user_exists("ghost")


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
    assert mem.status("erin")["semantic"] > 0

    mem.delete_user("erin")
    with pytest.raises(UnknownUserError):
        mem.list_episodes("erin")
    with pytest.raises(UnknownUserError):
        mem.search("erin", "hiking")
    assert not mem.store.user_exists("erin")
    assert all(v == 0 for v in mem.store.stats("erin").values())
    assert mem.store.list_episodes("erin") == [] and mem.store.list_semantic("erin") == []

    assert mem.status("frank") | {"counters": None} == frank | {"counters": None}
    assert mem.search("frank", "hiking").episodes
    # the deleted user can start over from scratch
    assert mem.add_messages("erin", exchange(2, prefix="e")).accepted == 2


# --------------------------------------------------------------------------- answer / search
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
        assert mem.status(u)["messages"] == 250 and mem.status(u)["pending"] == 250
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
            report = mem.flush(u)
        assert not report.parked
        st = mem.status(u)
        assert st["messages"] == 250 and st["pending"] == 0
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
