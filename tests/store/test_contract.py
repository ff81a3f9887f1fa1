"""One ``MemoryStore`` contract suite, run against every backend.

Backends: ``sqlite`` always; ``weaviate`` only when ``NEMORI_WEAVIATE_URL`` is set and
``nemori_dspy.store.weaviate.WeaviateStore`` imports. Every test uses fresh, unique user ids so a
shared server never leaks state between tests.
"""

from __future__ import annotations

import inspect
import math
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

import pytest

from nemori_dspy.errors import EmbedderMismatchError, NotFoundError, StoreError
from nemori_dspy.store.base import MemoryStore
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import Episode, Message, SemanticEntry

T0 = datetime(2023, 5, 7, 13, 0)

# 4-d unit vectors built by hand: cosines against Q are exact or nearly so.
Q = [1.0, 0.0, 0.0, 0.0]
E_SAME = [1.0, 0.0, 0.0, 0.0]          # cos = 1
E_NEAR = [0.8, 0.6, 0.0, 0.0]          # cos = 0.8
E_ORTHO = [0.0, 1.0, 0.0, 0.0]         # cos = 0
E_OPP = [-1.0, 0.0, 0.0, 0.0]          # cos = -1


# --------------------------------------------------------------------------- backends
@dataclass
class Backend:
    """A backend under test: ``open()`` returns a new store instance over the same data."""

    name: str
    open: Callable[[], MemoryStore]
    fresh_namespace: bool = True  # a brand-new, empty store (embedder not yet recorded)
    opened: list[MemoryStore] = field(default_factory=list)

    def reopen(self) -> MemoryStore:
        s = self.open()
        self.opened.append(s)
        return s


def _sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "m.db"
    return Backend("sqlite", lambda: SQLiteStore(path))


def _weaviate_backend() -> Backend:
    url = os.environ.get("NEMORI_WEAVIATE_URL")
    if not url:  # pragma: no cover - guarded by the skipif mark too
        pytest.skip("NEMORI_WEAVIATE_URL is not set")
    try:
        from nemori_dspy.store.weaviate import WeaviateStore  # lazy: optional module/dependency
    except ImportError as exc:
        pytest.skip(f"WeaviateStore is not importable: {exc}")
    ns = "NemoriTest" + uuid.uuid4().hex[:10]
    params = inspect.signature(WeaviateStore).parameters
    kw = {}
    for name in ("prefix", "collection_prefix", "namespace", "collection"):
        if name in params:
            kw[name] = ns
            break
    return Backend("weaviate", lambda: WeaviateStore(url, **kw), fresh_namespace=bool(kw))


@pytest.fixture(params=[
    "sqlite",
    pytest.param("weaviate", marks=pytest.mark.skipif(
        not os.environ.get("NEMORI_WEAVIATE_URL"), reason="NEMORI_WEAVIATE_URL is not set (no Weaviate server)")),
])
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    b = _sqlite_backend(tmp_path) if request.param == "sqlite" else _weaviate_backend()
    yield b
    for s in b.opened:
        try:
            s.close()
        except Exception:  # pragma: no cover
            pass


@pytest.fixture
def store(backend: Backend):
    s = backend.reopen()
    users: list[str] = []
    s._test_users = users  # type: ignore[attr-defined]
    yield s
    for u in users:  # leave a shared server clean
        try:
            s.delete_user(u)
        except Exception:  # pragma: no cover
            pass


@pytest.fixture
def new_user(store: MemoryStore) -> Callable[[str], str]:
    def make(label: str = "u") -> str:
        uid = f"{label}-{uuid.uuid4().hex[:8]}"
        store._test_users.append(uid)  # type: ignore[attr-defined]
        return uid
    return make


# --------------------------------------------------------------------------- builders
def msg(i: int, id: str | None = "auto", speaker: str = "Alice", content: str | None = None) -> Message:
    return Message(speaker=speaker, content=content or f"message number {i}",
                   timestamp=T0 + timedelta(minutes=i), id=f"m{i}" if id == "auto" else id)


def episode(user: str, eid: str, message_ids: list[str], vector: list[float], window: int = 0,
            start_min: int = 0, supersedes: list[str] | None = None) -> Episode:
    return Episode(id=eid, user_id=user, cue=f"cue {eid}", narrative=f"narrative of {eid}",
                   message_ids=message_ids, start=T0 + timedelta(minutes=start_min),
                   end=T0 + timedelta(minutes=start_min + 1), vector=vector, window=window,
                   supersedes=supersedes or [])


def entry(user: str, sid: str, vector: list[float], source: str = "e0") -> SemanticEntry:
    return SemanticEntry(id=sid, user_id=user, text=f"fact {sid}", vector=vector, source_episode_ids=[source])


def seed_episodes(store: MemoryStore, user: str, vectors: dict[str, list[float]]) -> None:
    """One message and one episode per window, in the dict's order (windows 0, 1, ...)."""
    for w, (eid, vec) in enumerate(vectors.items()):
        store.add_messages(user, [msg(100 + w, id=f"msg-{eid}")])
        store.commit_window(user, store.next_window(user), [episode(user, eid, [f"msg-{eid}"], vec, window=w,
                                                                    start_min=100 + w)], [])


def ids(results) -> list[str]:
    """Ids of scored search results (episodes or semantic entries), in result order."""
    return [r.episode.id if hasattr(r, "episode") else r.entry.id for r in results]


# --------------------------------------------------------------------------- messages
def test_add_messages_with_ids_is_idempotent(store, new_user):
    u = new_user()
    first = store.add_messages(u, [msg(1), msg(2)])
    assert [m.id for m in first] == ["m1", "m2"]
    assert all(m.user_id == u and m.episode_id is None for m in first)
    assert store.add_messages(u, [msg(1), msg(2)]) == []
    # a batch mixing old and new returns only the new one
    again = store.add_messages(u, [msg(2), msg(3), msg(1)])
    assert [m.id for m in again] == ["m3"]
    assert [m.id for m in store.pending_messages(u)] == ["m1", "m2", "m3"]
    assert store.stats(u)["messages"] == 3


def test_add_messages_without_ids_dedupes_on_content(store, new_user):
    u = new_user()
    batch = [msg(1, id=None), msg(2, id=None)]
    first = store.add_messages(u, batch)
    assert len(first) == 2 and first[0].id != first[1].id
    assert store.add_messages(u, [msg(1, id=None), msg(2, id=None)]) == []
    # same text by another speaker, or at another time, is a different message
    other = store.add_messages(u, [msg(1, id=None, speaker="Bob"),
                                   Message(speaker="Alice", content="message number 1",
                                           timestamp=T0 + timedelta(days=1))])
    assert len(other) == 2
    assert store.stats(u)["messages"] == 4


def test_pending_messages_order_and_limit(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(3), msg(1)])
    store.add_messages(u, [msg(2), msg(5), msg(4)])
    pending = store.pending_messages(u)
    assert [m.id for m in pending] == ["m3", "m1", "m2", "m5", "m4"]  # arrival order, not timestamp
    seqs = [m.seq for m in pending]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert [m.id for m in store.pending_messages(u, limit=2)] == ["m3", "m1"]
    assert [m.content for m in store.pending_messages(u, limit=1)] == ["message number 3"]
    assert store.pending_messages(new_user("nobody")) == []


def test_get_messages_in_given_order_skips_unknown(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2), msg(3)])
    got = store.get_messages(u, ["m3", "nope", "m1"])
    assert [m.id for m in got] == ["m3", "m1"]
    assert got[0].timestamp == T0 + timedelta(minutes=3) and got[0].speaker == "Alice"


# --------------------------------------------------------------------------- windows / episodes
def test_commit_window_assigns_messages_and_bumps_window(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(i) for i in range(1, 6)])
    assert store.next_window(u) == 0
    store.commit_window(u, 0, [episode(u, "e1", ["m1", "m2"], E_SAME),
                               episode(u, "e2", ["m3"], E_NEAR, start_min=3)], [])
    assert store.next_window(u) == 1
    assert [m.id for m in store.pending_messages(u)] == ["m4", "m5"]
    assert {m.id: m.episode_id for m in store.get_messages(u, ["m1", "m2", "m3", "m4"])} == {
        "m1": "e1", "m2": "e1", "m3": "e2", "m4": None}
    got = store.get_episode(u, "e1")
    assert got.message_ids == ["m1", "m2"] and [m.id for m in got.messages] == ["m1", "m2"]
    assert got.cue == "cue e1" and got.narrative == "narrative of e1" and got.window == 0
    assert [e.id for e in store.list_episodes(u)] == ["e1", "e2"]
    store.commit_window(u, 1, [episode(u, "e3", ["m4", "m5"], E_ORTHO, window=1, start_min=4)], [])
    assert store.pending_messages(u) == []
    assert store.next_window(u) == 2
    st = store.stats(u)
    assert (st["messages"], st["pending"], st["episodes"], st["to_distill"]) == (5, 0, 3, 3)


def test_commit_window_supersedes_episodes(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2), msg(3)])
    store.commit_window(u, 0, [episode(u, "old", ["m1", "m2"], E_SAME)], [])
    merged = episode(u, "merged", ["m1", "m2", "m3"], E_NEAR, window=1, supersedes=["old"])
    store.commit_window(u, 1, [merged], ["old"])
    assert [e.id for e in store.list_episodes(u)] == ["merged"]
    assert store.get_episode(u, "merged").supersedes == ["old"]
    assert "old" not in ids(store.search_episodes(u, Q, top_k=10))
    with pytest.raises(NotFoundError):
        store.get_episode(u, "old")
    assert "old" not in [e.id for e in store.episodes_to_distill(u)]
    # each message belongs to the one live episode
    assert {m.episode_id for m in store.get_messages(u, ["m1", "m2", "m3"])} == {"merged"}
    st = store.stats(u)
    assert st["episodes"] == 1 and st["superseded_episodes"] == 1


def test_commit_window_rejects_stale_window(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_SAME)], [])
    with pytest.raises(StoreError):
        store.commit_window(u, 0, [episode(u, "e-replay", ["m2"], E_NEAR)], ["e1"])
    # the rejected commit changed nothing
    assert [e.id for e in store.list_episodes(u)] == ["e1"]
    assert [m.id for m in store.pending_messages(u)] == ["m2"]
    assert store.next_window(u) == 1


def test_search_episodes_orders_by_cosine(store, new_user):
    u = new_user()
    seed_episodes(store, u, {"opp": E_OPP, "ortho": E_ORTHO, "same": E_SAME, "near": E_NEAR})
    hits = store.search_episodes(u, Q, top_k=10)
    assert ids(hits) == ["same", "near", "ortho", "opp"]
    assert [round(h.score, 5) for h in hits] == [1.0, 0.8, 0.0, -1.0]
    assert ids(store.search_episodes(u, Q, top_k=2)) == ["same", "near"]
    assert store.search_episodes(u, Q, top_k=0) == []
    # query need not be unit length: cosine, not dot product
    assert ids(store.search_episodes(u, [5.0, 0, 0, 0], top_k=1)) == ["same"]
    assert hits[0].episode.messages and hits[0].episode.messages[0].id == "msg-same"


def test_search_episodes_ties_broken_by_id(store, new_user):
    u = new_user()
    seed_episodes(store, u, {"b": E_NEAR, "c": E_NEAR, "a": E_NEAR})
    assert ids(store.search_episodes(u, Q, top_k=3)) == ["a", "b", "c"]
    assert ids(store.search_episodes(u, Q, top_k=2)) == ["a", "b"]


def test_search_episodes_before_window(store, new_user):
    u = new_user()
    seed_episodes(store, u, {"w0": E_NEAR, "w1": E_ORTHO, "w2": E_SAME, "w3": E_SAME})
    assert ids(store.search_episodes(u, Q, top_k=10, before_window=2)) == ["w0", "w1"]
    assert store.search_episodes(u, Q, top_k=10, before_window=0) == []
    assert ids(store.search_episodes(u, Q, top_k=1, before_window=3)) == ["w2"]


# --------------------------------------------------------------------------- semantic
def _seed_semantic(store, u, vectors: dict[str, list[float]]) -> None:
    store.add_messages(u, [msg(1)])
    store.commit_window(u, 0, [episode(u, "e0", ["m1"], E_SAME)], [])
    store.commit_distillation(u, "e0", [entry(u, k, v) for k, v in vectors.items()], [])


def test_search_semantic_orders_by_cosine(store, new_user):
    u = new_user()
    _seed_semantic(store, u, {"opp": E_OPP, "near": E_NEAR, "same": E_SAME, "ortho": E_ORTHO})
    hits = store.search_semantic(u, Q, top_k=10)
    assert ids(hits) == ["same", "near", "ortho", "opp"]
    assert [round(h.score, 5) for h in hits] == [1.0, 0.8, 0.0, -1.0]
    assert ids(store.search_semantic(u, Q, top_k=2)) == ["same", "near"]


def test_search_semantic_threshold_is_strict(store, new_user):
    u = new_user()
    _seed_semantic(store, u, {"same": E_SAME, "near": E_NEAR, "ortho": E_ORTHO, "opp": E_OPP})
    # cosine exactly 0 with threshold 0 is excluded; negative excluded; positive kept
    assert ids(store.search_semantic(u, Q, top_k=10, threshold=0.0)) == ["same", "near"]
    # cosine exactly 1 with threshold 1 is excluded
    assert ids(store.search_semantic(u, Q, top_k=10, threshold=1.0)) == []
    # at the entry's own score: excluded; just below it: included
    s_near = {h.entry.id: h.score for h in store.search_semantic(u, Q, top_k=10)}["near"]
    assert ids(store.search_semantic(u, Q, top_k=10, threshold=s_near)) == ["same"]
    assert ids(store.search_semantic(u, Q, top_k=10, threshold=s_near - 1e-4)) == ["same", "near"]
    assert all(h.score > 0.5 for h in store.search_semantic(u, Q, top_k=10, threshold=0.5))
    # threshold filters before top-k: top_k still bounds the result
    assert ids(store.search_semantic(u, Q, top_k=1, threshold=-2.0)) == ["same"]


def test_commit_distillation_inserts_deletes_and_marks_distilled(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_SAME), episode(u, "e2", ["m2"], E_NEAR, start_min=2)], [])
    assert [e.id for e in store.episodes_to_distill(u)] == ["e1", "e2"]

    store.commit_distillation(u, "e1", [entry(u, "s1", E_SAME, "e1"), entry(u, "s2", E_NEAR, "e1")], [])
    assert [e.id for e in store.episodes_to_distill(u)] == ["e2"]
    assert store.get_episode(u, "e1").distilled is True
    assert {e.id for e in store.list_semantic(u)} == {"s1", "s2"}
    assert store.get_semantic(u, "s1").source_episode_ids == ["e1"]

    store.commit_distillation(u, "e2", [entry(u, "s3", E_ORTHO, "e2")], ["s1"])
    assert store.episodes_to_distill(u) == []
    assert {e.id for e in store.list_semantic(u)} == {"s2", "s3"}
    with pytest.raises(NotFoundError):
        store.get_semantic(u, "s1")
    assert "s1" not in ids(store.search_semantic(u, Q, top_k=10))
    st = store.stats(u)
    assert st["semantic"] == 2 and st["to_distill"] == 0


def test_commit_distillation_is_all_or_nothing(store, new_user):
    u = new_user()
    _seed_semantic(store, u, {"keep": E_NEAR})
    store.add_messages(u, [msg(2)])
    store.commit_window(u, 1, [episode(u, "e1", ["m2"], E_ORTHO, window=1, start_min=2)], [])

    class Exploding:
        """An insert that fails half-way through the step (after a valid insert)."""

        def __getattr__(self, name):
            raise RuntimeError("boom")

    with pytest.raises(Exception):
        store.commit_distillation(u, "e1", [entry(u, "new", E_SAME, "e1"), Exploding()], ["keep"])
    assert [e.id for e in store.list_semantic(u)] == ["keep"]
    assert [e.id for e in store.episodes_to_distill(u)] == ["e1"]
    assert ids(store.search_semantic(u, Q, top_k=10)) == ["keep"]


# --------------------------------------------------------------------------- users
def test_users_are_isolated(store, new_user):
    a, b = new_user("a"), new_user("b")
    for u, tag in ((a, "A"), (b, "B")):
        # same message ids for both users: keyed per user
        assert len(store.add_messages(u, [msg(1, content=f"{tag} one"), msg(2, content=f"{tag} two")])) == 2
        store.commit_window(u, 0, [episode(u, f"ep-{tag}", ["m1"], E_SAME)], [])
        store.commit_distillation(u, f"ep-{tag}", [entry(u, f"se-{tag}", E_SAME, f"ep-{tag}")], [])

    for u, tag, other in ((a, "A", "B"), (b, "B", "A")):
        assert [m.content for m in store.pending_messages(u)] == [f"{tag} two"]
        assert [m.content for m in store.get_messages(u, ["m1", "m2"])] == [f"{tag} one", f"{tag} two"]
        assert [e.id for e in store.list_episodes(u)] == [f"ep-{tag}"]
        assert [e.id for e in store.list_semantic(u)] == [f"se-{tag}"]
        assert ids(store.search_episodes(u, Q, top_k=10)) == [f"ep-{tag}"]
        assert ids(store.search_semantic(u, Q, top_k=10)) == [f"se-{tag}"]
        assert store.get_episode(u, f"ep-{tag}").messages[0].content == f"{tag} one"
        with pytest.raises(NotFoundError):
            store.get_episode(u, f"ep-{other}")
        with pytest.raises(NotFoundError):
            store.get_semantic(u, f"se-{other}")
        assert store.stats(u)["messages"] == 2
    users = store.list_users()
    assert a in users and b in users and users == sorted(users)


def test_delete_user_removes_everything(store, new_user):
    a, b = new_user("a"), new_user("b")
    for u in (a, b):
        store.add_messages(u, [msg(1), msg(2)])
        store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_SAME)], [])
        store.commit_distillation(u, "e1", [entry(u, "s1", E_SAME, "e1")], [])
    assert store.user_exists(a)
    store.delete_user(a)
    assert not store.user_exists(a)
    assert a not in store.list_users()
    assert store.list_episodes(a) == [] and store.list_semantic(a) == [] and store.pending_messages(a) == []
    assert store.get_messages(a, ["m1", "m2"]) == []
    assert store.search_episodes(a, Q, top_k=10) == [] and store.search_semantic(a, Q, top_k=10) == []
    assert all(v == 0 for v in store.stats(a).values())
    with pytest.raises(NotFoundError):
        store.get_episode(a, "e1")
    # re-adding after deletion starts from scratch
    assert len(store.add_messages(a, [msg(1)])) == 1
    # the other user is untouched
    assert store.user_exists(b)
    assert [e.id for e in store.list_episodes(b)] == ["e1"]
    assert ids(store.search_semantic(b, Q, top_k=10)) == ["s1"]
    assert store.stats(b)["messages"] == 2


def test_delete_and_recreate_user_seen_by_another_instance(backend: Backend, store, new_user):
    """A second store instance (another process) must not serve results of a deleted user."""
    u = new_user()
    other = backend.reopen()
    store.add_messages(u, [msg(1)])
    store.commit_window(u, 0, [episode(u, "before", ["m1"], E_SAME)], [])
    store.commit_distillation(u, "before", [entry(u, "s-before", E_SAME, "before")], [])
    assert ids(other.search_episodes(u, Q, top_k=5)) == ["before"]
    assert ids(other.search_semantic(u, Q, top_k=5)) == ["s-before"]

    store.delete_user(u)
    store.add_messages(u, [msg(1)])
    store.commit_window(u, store.next_window(u), [episode(u, "after", ["m1"], E_SAME)], [])
    store.commit_distillation(u, "after", [entry(u, "s-after", E_SAME, "after")], [])
    assert ids(other.search_episodes(u, Q, top_k=5)) == ["after"]
    assert ids(other.search_semantic(u, Q, top_k=5)) == ["s-after"]


def test_user_exists_and_unknown_user(store, new_user):
    u = new_user()
    assert not store.user_exists(u)
    assert store.next_window(u) == 0
    assert store.list_episodes(u) == [] and store.search_episodes(u, Q, top_k=5) == []
    store.add_messages(u, [msg(1)])
    assert store.user_exists(u)


def test_unknown_ids_raise_not_found(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1)])
    with pytest.raises(NotFoundError):
        store.get_episode(u, "no-such-episode")
    with pytest.raises(NotFoundError):
        store.get_semantic(u, "no-such-entry")
    with pytest.raises(NotFoundError):
        store.get_episode(new_user("ghost"), "no-such-episode")


# --------------------------------------------------------------------------- embedder / persistence
def test_check_embedder_records_once_then_rejects_other(backend: Backend, store):
    if not backend.fresh_namespace:
        pytest.skip(f"{backend.name}: cannot open an isolated empty store")
    store.check_embedder("all-MiniLM-L6-v2", 384)
    store.check_embedder("all-MiniLM-L6-v2", 384)  # same again: fine
    store.close()
    reopened = backend.reopen()
    reopened.check_embedder("all-MiniLM-L6-v2", 384)
    with pytest.raises(EmbedderMismatchError) as exc:
        reopened.check_embedder("all-MiniLM-L6-v2", 768)
    assert "384" in str(exc.value) and "768" in str(exc.value)
    with pytest.raises(EmbedderMismatchError) as exc2:
        reopened.check_embedder("text-embedding-3-small", 384)
    assert "text-embedding-3-small" in str(exc2.value) and "all-MiniLM-L6-v2" in str(exc2.value)
    # the recorded embedder did not change
    backend.reopen().check_embedder("all-MiniLM-L6-v2", 384)


def test_data_persists_across_reopen(backend: Backend, store, new_user):
    u = new_user()
    store.check_embedder("hashing-4", 4)
    store.add_messages(u, [msg(1), msg(2), msg(3)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1", "m2"], E_NEAR)], [])
    store.commit_distillation(u, "e1", [entry(u, "s1", E_NEAR, "e1")], [])
    before = store.stats(u)
    store.close()

    again = backend.reopen()
    again.check_embedder("hashing-4", 4)
    assert again.user_exists(u)
    assert again.stats(u) == before
    assert [m.id for m in again.pending_messages(u)] == ["m3"]
    assert again.next_window(u) == 1
    ep = again.get_episode(u, "e1")
    assert [m.id for m in ep.messages] == ["m1", "m2"] and ep.distilled
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(ep.vector, E_NEAR))
    hits = again.search_semantic(u, Q, top_k=5)
    assert ids(hits) == ["s1"] and math.isclose(hits[0].score, 0.8, abs_tol=1e-5)
    assert again.add_messages(u, [msg(1), msg(2), msg(3)]) == []  # idempotency survives reopen


# --------------------------------------------------------------------------- metadata, restricted search
def test_metadata_round_trips_with_json_types(backend: Backend, store, new_user):
    u = new_user()
    meta = {"session": "s1", "turn": 3, "score": 0.25, "flag": False}
    store.add_messages(u, [Message(speaker="A", content="x", timestamp=T0, id="m1", metadata=meta), msg(2)])
    got = {m.id: m.metadata for m in store.get_messages(u, ["m1", "m2"])}
    assert got == {"m1": meta, "m2": {}}
    assert type(got["m1"]["flag"]) is bool and type(got["m1"]["turn"]) is int
    store.commit_window(u, 0, [episode(u, "e1", ["m1", "m2"], E_SAME)], [])
    assert store.get_episode(u, "e1").messages[0].metadata == meta
    assert backend.reopen().get_messages(u, ["m1"])[0].metadata == meta


def test_episodes_with_metadata_include_superseded_versions(store, new_user):
    u = new_user()
    store.add_messages(u, [Message(speaker="A", content="one", timestamp=T0, id="m1", metadata={"s": "a"}),
                           Message(speaker="A", content="two", timestamp=T0, id="m2", metadata={"s": "b", "n": 1}),
                           msg(3)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_SAME), episode(u, "e2", ["m2"], E_NEAR)], [])
    store.commit_window(u, 1, [episode(u, "e1x", ["m1", "m3"], E_SAME, window=1, supersedes=["e1"])], ["e1"])
    assert store.episodes_with_metadata(u, {"s": "a"}) == {"e1", "e1x"}
    assert store.episodes_with_metadata(u, {"s": "b", "n": 1}) == {"e2"}
    assert store.episodes_with_metadata(u, {"s": "b", "n": True}) == set()   # True is not 1
    assert store.episodes_with_metadata(u, {"s": "c"}) == set()
    assert store.episodes_with_metadata(new_user("nobody"), {"s": "a"}) == set()


def test_search_restricted_to_episode_ids_and_sources(store, new_user):
    u = new_user()
    seed_episodes(store, u, {"a": E_SAME, "b": E_NEAR, "c": E_ORTHO})
    assert ids(store.search_episodes(u, Q, top_k=10, only={"b", "c"})) == ["b", "c"]
    assert store.search_episodes(u, Q, top_k=10, only=set()) == []
    assert ids(store.search_episodes(u, Q, top_k=10, before_window=2, only={"b", "c"})) == ["b"]
    store.commit_distillation(u, "a", [entry(u, "sa", E_SAME, "a"), entry(u, "sb", E_NEAR, "b")], [])
    assert ids(store.search_semantic(u, Q, top_k=10, sources={"b"})) == ["sb"]
    assert ids(store.search_semantic(u, Q, top_k=10, sources={"a", "b"})) == ["sa", "sb"]
    assert store.search_semantic(u, Q, top_k=10, sources={"zzz"}) == []


# --------------------------------------------------------------------------- delete one message
def test_delete_message_removes_it_and_derived_only(backend: Backend, store, new_user):
    u, v = new_user("u"), new_user("v")
    for user in (u, v):
        store.add_messages(user, [msg(1), msg(2), msg(3), msg(4)])
        store.commit_window(user, 0, [episode(user, "e1", ["m1", "m2"], E_SAME),
                                      episode(user, "e2", ["m3"], E_NEAR, start_min=3)], [])
        store.commit_distillation(user, "e1", [entry(user, "only1", E_SAME, "e1")], [])
        store.commit_distillation(user, "e2", [entry(user, "only2", E_NEAR, "e2"),
                                               SemanticEntry(id="both", user_id=user, text="both", vector=E_ORTHO,
                                                             source_episode_ids=["e1", "e2"])], [])
    out = store.delete_message(u, "m1")
    assert out == {"episodes": ["e1"], "semantic": ["only1"], "requeued": ["m2"]}
    assert [e.id for e in store.list_episodes(u)] == ["e2"]
    assert {e.id for e in store.list_semantic(u)} == {"only2", "both"}
    assert [m.id for m in store.pending_messages(u)] == ["m2", "m4"]        # back in the buffer, in arrival order
    assert store.get_messages(u, ["m1", "m2"])[0].id == "m2"
    assert store.get_messages(u, ["m2"])[0].episode_id is None
    st = store.stats(u)
    assert (st["messages"], st["pending"], st["episodes"], st["semantic"]) == (3, 2, 1, 2)
    with pytest.raises(NotFoundError):
        store.delete_message(u, "m1")
    with pytest.raises(NotFoundError):
        store.delete_message(new_user("ghost"), "m1")
    # the re-buffered message is processed again like a new one
    store.commit_window(u, store.next_window(u), [episode(u, "e3", ["m2", "m4"], E_SAME, window=1)], [])
    assert store.pending_messages(u) == [] and store.get_messages(u, ["m2"])[0].episode_id == "e3"
    # another instance sees the same; the other user is untouched
    again = backend.reopen()
    assert {e.id for e in again.list_episodes(u)} == {"e2", "e3"} and again.get_messages(u, ["m1"]) == []
    assert [e.id for e in again.list_episodes(v)] == ["e1", "e2"] and again.stats(v)["semantic"] == 3
    # a deleted id can be added again, as a new message
    assert [m.id for m in store.add_messages(u, [msg(1)])] == ["m1"]


def test_delete_pending_message(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2)])
    assert store.delete_message(u, "m1") == {"episodes": [], "semantic": [], "requeued": []}
    assert [m.id for m in store.pending_messages(u)] == ["m2"]
    assert store.stats(u)["messages"] == 1


# --------------------------------------------------------------------------- mixed timestamp kinds
def test_naive_and_offset_timestamps_round_trip_and_order_by_instant(store, new_user):
    """A naive and an offset-carrying timestamp keep their own clock time and order by the moment they
    denote (naive read as UTC by default): 23:30+08:00 (15:30 UTC) comes before a naive 20:00."""
    u = new_user()
    aware = datetime.fromisoformat("2023-05-24T23:30:00+08:00")
    naive = datetime(2023, 5, 24, 20, 0)
    store.add_messages(u, [Message(speaker="Alice", content="late in Shanghai", timestamp=aware, id="a"),
                           Message(speaker="Bob", content="evening, naive", timestamp=naive, id="n")])
    assert [m.timestamp for m in store.get_messages(u, ["a", "n"])] == [aware, naive]
    eps = [Episode(id=eid, user_id=u, cue=eid, narrative=eid, message_ids=[mid], start=ts, end=ts,
                   vector=[1.0, 0.0, 0.0], window=0) for eid, mid, ts in (("e-naive", "n", naive),
                                                                          ("e-aware", "a", aware))]
    store.commit_window(u, store.next_window(u), eps, [])
    listed = store.list_episodes(u)
    assert [e.id for e in listed] == ["e-aware", "e-naive"]
    assert listed[0].start == aware and listed[0].start.utcoffset() == timedelta(hours=8)
    assert listed[1].start.tzinfo is None
    assert [e.id for e in store.episodes_to_distill(u)] == ["e-aware", "e-naive"]


def test_an_embedder_of_unknown_dimension_is_recorded_from_the_first_vectors(backend: Backend, store, new_user):
    """A litellm embedder knows its dimension only after its first reply: the store records the name at
    once and the dimension from the first stored vectors; reopening with it (still unknown) opens, a
    known other dimension or another name is refused."""
    if not backend.fresh_namespace:
        pytest.skip(f"{backend.name}: cannot open an isolated empty store")
    u = new_user()
    store.check_embedder("openai/text-embedding-3-small", None)
    store.add_messages(u, [msg(1)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_NEAR)], [])
    store.close()
    again = backend.reopen()
    again.check_embedder("openai/text-embedding-3-small", None)
    again.check_embedder("openai/text-embedding-3-small", len(E_NEAR))
    with pytest.raises(EmbedderMismatchError):
        again.check_embedder("openai/text-embedding-3-small", len(E_NEAR) + 1)
    with pytest.raises(EmbedderMismatchError):
        again.check_embedder("all-MiniLM-L6-v2", None)


# --------------------------------------------------------------------------- event time of semantic entries
def test_semantic_event_times_round_trip_apart_from_ingestion_time(backend: Backend, store, new_user):
    """A fact keeps the span of its source episodes (naive or offset-carrying, as given) next to, and
    distinct from, its ``created_at``; an entry stored without event time reads back as None."""
    u = new_user()
    naive_start, naive_end = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 2, 9, 0)
    aware = datetime.fromisoformat("2023-05-24T23:30:00+08:00")
    spanned = SemanticEntry(id="s-span", user_id=u, text="Caroline adopted a dog.", vector=E_SAME,
                            source_episode_ids=["e0"], event_start=naive_start, event_end=naive_end)
    offset = SemanticEntry(id="s-aware", user_id=u, text="Bob moved.", vector=E_NEAR, source_episode_ids=["e0"],
                           event_start=aware, event_end=aware)
    undated = entry(u, "s-undated", E_ORTHO)
    store.add_messages(u, [msg(1)])
    store.commit_window(u, 0, [episode(u, "e0", ["m1"], E_SAME)], [])
    store.commit_distillation(u, "e0", [spanned, offset, undated], [])
    store.close()
    again = backend.reopen()

    got = {e.id: e for e in again.list_semantic(u)}
    assert (got["s-span"].event_start, got["s-span"].event_end) == (naive_start, naive_end)
    assert got["s-span"].event_start.tzinfo is None
    assert got["s-aware"].event_start == aware and got["s-aware"].event_start.utcoffset() == timedelta(hours=8)
    assert got["s-undated"].event_start is None and got["s-undated"].event_end is None
    assert got["s-span"].created_at.year >= 2024  # ingestion time: kept, and not the event time
    assert again.get_semantic(u, "s-span").event_end == naive_end
    hit = again.search_semantic(u, Q, top_k=1)[0].entry
    assert (hit.id, hit.event_start, hit.event_end) == ("s-span", naive_start, naive_end)


# --------------------------------------------------------------------------- lexical retrieval (non-Latin script)
# A Chinese conversation, embedded by a "fake" English-only embedder: the unrelated episode is nearest
# to the query by cosine (0.9 vs 0.7), only the answer shares the query's characters.
ZH_QUERY = "卡罗琳参加了什么支持小组？"
ZH_ANSWER = ["卡罗琳：我上周六去了LGBTQ支持小组，那里的故事很感人。", "梅兰妮：太好了，你一定很受鼓舞。"]
ZH_OTHER = ["梅兰妮：我和孩子们去博物馆看了恐龙化石。", "卡罗琳：听起来很好玩！"]
V_ANSWER = [0.7, math.sqrt(1 - 0.49), 0.0, 0.0]   # cos 0.7 to Q
V_OTHER = [0.9, 0.0, math.sqrt(1 - 0.81), 0.0]    # cos 0.9 to Q
V_FAR = [0.1, 0.0, 0.0, math.sqrt(1 - 0.01)]      # cos 0.1 to Q


def seed_chinese(store: MemoryStore, user: str) -> None:
    """Three episodes (answer, distractor, far) with their raw messages and one fact each."""
    spec = {"zh-answer": (ZH_ANSWER, V_ANSWER, "卡罗琳去了LGBTQ支持小组。"),
            "zh-other": (ZH_OTHER, V_OTHER, "梅兰妮带孩子们去了博物馆。"),
            "zh-far": (["卡罗琳：今天下雨了。"], V_FAR, "那天下雨。")}
    for w, (eid, (lines, vec, fact)) in enumerate(spec.items()):
        ms = [Message(speaker=line.split("：")[0], content=line, timestamp=T0 + timedelta(minutes=10 * w + i),
                      id=f"{eid}-m{i}") for i, line in enumerate(lines)]
        store.add_messages(user, ms)
        ep = Episode(id=eid, user_id=user, cue=f"对话 {w}", narrative=fact, message_ids=[m.id for m in ms],
                     start=ms[0].timestamp, end=ms[-1].timestamp, vector=vec, window=w)
        store.commit_window(user, store.next_window(user), [ep], [])
        store.commit_distillation(user, eid, [SemanticEntry(id=f"s-{eid}", user_id=user, text=fact, vector=vec,
                                                            source_episode_ids=[eid])], [])


def test_a_chinese_query_ranks_the_answer_first_only_with_lexical_fusion(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    assert ids(store.search_episodes(u, Q, 3))[0] == "zh-other"            # vector only: wrong
    assert ids(store.search_semantic(u, Q, 3))[0] == "s-zh-other"
    fused = store.search_episodes(u, Q, 3, query=ZH_QUERY)
    assert ids(fused)[0] == "zh-answer"                                     # fused: right
    assert [h.score for h in fused] == sorted((h.score for h in fused), reverse=True)
    assert all(h.score <= 1.0 + 1e-9 for h in fused)
    assert fused[0].episode.messages and fused[0].episode.messages[0].content == ZH_ANSWER[0]
    assert ids(store.search_semantic(u, Q, 3, query=ZH_QUERY))[0] == "s-zh-answer"
    both = store.search(u, Q, 2, 2, query=ZH_QUERY)
    assert ids(both.episodes)[0] == "zh-answer" and ids(both.semantic)[0] == "s-zh-answer"
    assert ids(both.episodes) == ids(store.search_episodes(u, Q, 2, query=ZH_QUERY))


def test_lexical_weight_zero_is_the_vector_only_search(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    store.lexical_weight = 0.0
    assert ids(store.search_episodes(u, Q, 3, query=ZH_QUERY)) == ["zh-other", "zh-answer", "zh-far"]
    assert [round(h.score, 4) for h in store.search_episodes(u, Q, 3, query=ZH_QUERY)] == [0.9, 0.7, 0.1]


def test_fused_search_keeps_its_filters(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    assert ids(store.search_episodes(u, Q, 3, only={"zh-other", "zh-far"}, query=ZH_QUERY)) == ["zh-other", "zh-far"]
    assert ids(store.search_semantic(u, Q, 3, sources={"zh-far"}, query=ZH_QUERY)) == ["s-zh-far"]
    assert store.search(u, Q, 3, 3, query=ZH_QUERY, only=set(), sources=set()).episodes == []
    other = new_user("other")
    assert store.search(other, Q, 3, 3, query=ZH_QUERY).episodes == []     # another user's text never matches


def test_a_retired_episode_no_longer_matches_lexically(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    store.delete_episode(u, "zh-answer")
    assert "zh-answer" not in ids(store.search_episodes(u, Q, 3, query=ZH_QUERY))
    merged = Episode(id="zh-merged", user_id=u, cue="合并", narrative="梅兰妮和卡罗琳聊了博物馆。",
                     message_ids=["zh-other-m0"], start=T0, end=T0, vector=V_FAR, window=3)
    store.commit_window(u, store.next_window(u), [merged], ["zh-other"])
    hits = ids(store.search_episodes(u, Q, 3, query="恐龙化石博物馆"))
    assert "zh-other" not in hits and hits[0] == "zh-merged"              # the raw message text is indexed


# --------------------------------------------------------------------------- deleting vs forgetting a fact
def test_delete_semantic_returns_the_source_episodes_that_still_hold_the_fact(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    assert store.delete_semantic(u, "s-zh-answer") == ["zh-answer"]
    assert store.get_episode(u, "zh-answer").narrative == "卡罗琳去了LGBTQ支持小组。"  # documented: still there
    with pytest.raises(NotFoundError):
        store.delete_semantic(u, "s-zh-answer")


def test_forget_semantic_removes_the_fact_its_episodes_and_their_messages(store, new_user):
    u = new_user()
    seed_chinese(store, u)
    shared = SemanticEntry(id="s-shared", user_id=u, text="两人是朋友。", vector=V_FAR,
                           source_episode_ids=["zh-answer", "zh-other"])
    store.commit_distillation(u, "zh-other", [shared], [])
    out = store.forget_semantic(u, "s-zh-answer")
    assert out == {"semantic": ["s-zh-answer"], "episodes": ["zh-answer"],
                   "messages": ["zh-answer-m0", "zh-answer-m1"], "requeued": []}
    assert store.get_messages(u, out["messages"]) == []
    with pytest.raises(NotFoundError):
        store.get_episode(u, "zh-answer")
    assert {e.id for e in store.list_semantic(u)} == {"s-zh-other", "s-zh-far", "s-shared"}  # backed elsewhere
    found = store.search(u, Q, 10, 10, query=ZH_QUERY)
    text = " ".join([h.episode.narrative + " ".join(m.content for m in h.episode.messages) for h in found.episodes]
                    + [h.entry.text for h in found.semantic])
    assert "支持小组" not in text
    with pytest.raises(NotFoundError):
        store.forget_semantic(u, "s-zh-answer")


def test_forget_reaches_a_merged_episode_and_rebuffers_its_other_messages(store, new_user):
    u = new_user()
    store.add_messages(u, [msg(1), msg(2), msg(3)])
    store.commit_window(u, 0, [episode(u, "e1", ["m1"], E_SAME), episode(u, "e2", ["m2"], E_NEAR)], [])
    store.commit_distillation(u, "e1", [entry(u, "s1", E_SAME, source="e1")], [])
    store.commit_window(u, 1, [episode(u, "e3", ["m1", "m2", "m3"], E_SAME, window=1)], ["e1", "e2"])
    out = store.forget_semantic(u, "s1")
    assert out["messages"] == ["m1"] and set(out["episodes"]) == {"e1", "e3"}
    assert out["requeued"] == ["m2", "m3"]
    assert [m.id for m in store.pending_messages(u)] == ["m2", "m3"]
    assert store.list_episodes(u) == [] and store.list_semantic(u) == []


# --------------------------------------------------------------------------- versions of a semantic entry
def version(user: str, sid: str, vector: list[float], supersedes: list[str], origin: str,
            source: str = "e0") -> SemanticEntry:
    return SemanticEntry(id=sid, user_id=user, text=f"fact {sid}", vector=vector, source_episode_ids=[source],
                         supersedes=supersedes, origin=origin)


def test_a_superseded_entry_is_retired_with_its_replacement_and_decision(backend: Backend, store, new_user):
    u, other = new_user(), new_user("other")
    _seed_semantic(store, u, {"s0": E_OPP, "s1": E_SAME, "s2": E_NEAR})
    store.add_messages(u, [msg(2)])
    store.commit_window(u, 1, [episode(u, "e1", ["m2"], E_ORTHO, window=1, start_min=2)], [])
    merged, fresh = version(u, "s3", E_SAME, ["s1"], "merge", "e1"), version(u, "s4", E_NEAR, ["s2"], "conflict", "e1")
    store.commit_distillation(u, "e1", [merged, fresh], ["s1", "s2", "s0"])   # s0: no insert names it

    assert {e.id for e in store.list_semantic(u)} == {"s3", "s4"}
    assert ids(store.search_semantic(u, Q, top_k=10)) == ["s3", "s4"]          # retired versions are never searched
    assert store.get_semantic(u, "s3").origin == "merge" and store.get_semantic(u, "s3").supersedes == ["s1"]
    for s in (store, backend.reopen()):                                      # kept across a reopen
        got = s.semantic_versions(u, ["s3", "s1", "nope", "s2", "s0", "s1"])
        assert [v.id for v in got] == ["s3", "s1", "s2", "s0"]               # given order, unknown skipped, once
        live, s1, s2, s0 = got
        assert live.live and live.retired_at is None and live.retired_by is None and live.retired_decision is None
        assert (s1.live, s1.retired_by, s1.retired_decision, s1.text) == (False, "s3", "merge", "fact s1")
        assert (s2.retired_by, s2.retired_decision) == ("s4", "conflict")
        assert (s0.retired_by, s0.retired_decision) == (None, "superseded")
        assert all(v.retired_at is not None for v in (s1, s2, s0))
        assert s1.event_start == s1.event_end is None and s1.source_episode_ids == ["e0"]
    assert store.semantic_versions(other, ["s1", "s3"]) == [] and store.semantic_versions(u, []) == []
    assert store.stats(u)["semantic"] == 2


def test_replace_semantic_retires_the_entry_for_a_new_version(store, new_user):
    u = new_user()
    _seed_semantic(store, u, {"s1": E_OPP, "keep": E_ORTHO})
    store.replace_semantic(u, "s1", version(u, "s1v2", E_SAME, ["s1"], "user_update"))
    with pytest.raises(NotFoundError):
        store.get_semantic(u, "s1")
    assert [e.id for e in store.list_semantic(u)] == ["keep", "s1v2"] or \
        {e.id for e in store.list_semantic(u)} == {"keep", "s1v2"}
    assert ids(store.search_semantic(u, Q, top_k=10)) == ["s1v2", "keep"]     # the old version is not searched
    assert store.stats(u)["semantic"] == 2
    store.replace_semantic(u, "s1v2", version(u, "s1v3", E_NEAR, ["s1v2"], "user_update"))
    s1, v2, v3 = store.semantic_versions(u, ["s1", "s1v2", "s1v3"])
    assert (s1.retired_by, s1.retired_decision, v2.retired_by, v2.retired_decision) == \
        ("s1v2", "user_update", "s1v3", "user_update")
    assert v3.live and v3.origin == "user_update" and v3.supersedes == ["s1v2"] and not v2.live
    with pytest.raises(NotFoundError):                                       # a retired version is not replaced
        store.replace_semantic(u, "s1", version(u, "x", E_SAME, ["s1"], "user_update"))
    with pytest.raises(NotFoundError):
        store.replace_semantic(new_user("nobody"), "s1v3", version(u, "y", E_SAME, ["s1v3"], "user_update"))
    with pytest.raises(StoreError):                                          # a new version needs its own id
        store.replace_semantic(u, "s1v3", version(u, "s1v3", E_SAME, [], "user_update"))
    assert store.get_semantic(u, "s1v3").text == "fact s1v3"


def test_forgetting_a_fact_removes_its_retired_versions_too(store, new_user):
    u = new_user()
    _seed_semantic(store, u, {"s1": E_SAME})
    store.replace_semantic(u, "s1", version(u, "s1v2", E_NEAR, ["s1"], "user_update"))
    out = store.forget_semantic(u, "s1v2")
    assert "s1v2" in out["semantic"]
    assert store.semantic_versions(u, ["s1", "s1v2"]) == []                  # both sourced from the removed episode
    v = new_user()
    _seed_semantic(store, v, {"s1": E_SAME})
    store.replace_semantic(v, "s1", version(v, "s1v2", E_NEAR, ["s1"], "user_update"))
    store.delete_user(v)
    assert store.semantic_versions(v, ["s1", "s1v2"]) == []
