"""REST API end to end: uvicorn on 127.0.0.1 (free port) in a thread, httpx as the client, a
ScriptedLM behind the background worker (real DSPy ChatAdapter), SQLiteStore + HashingEmbedder."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import dspy
import httpx
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.errors import ConfigError
from nemori_dspy.memory import Memory
from nemori_dspy.apps.serving.http import Limits, check_bind, create_app, user_token
from nemori_dspy.apps.serving.worker import BackgroundProcessor
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, default_responders

from tests.fakes import RunningServer, messages, wait_until

TOKEN = "test-server-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def lm():
    return ScriptedLM(default_responders())


@pytest.fixture
def make_server(tmp_path: Path, lm):
    """``make_server(threads=2, limits=Limits(), token=TOKEN)`` → (RunningServer, Memory), stopped at teardown."""
    opened: list = []

    def make(threads: int = 2, limits: Limits = Limits(), token: str | None = TOKEN, db: Path | None = None):
        store = SQLiteStore(db or tmp_path / "serve.db")
        memory = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=4))
        proc = BackgroundProcessor(memory, threads=threads, lm=lm, adapter=dspy.ChatAdapter())
        srv = RunningServer(create_app(memory, proc, token=token, limits=limits)).__enter__()
        opened.append((srv, store))
        return srv, memory

    yield make
    for srv, store in opened:
        if srv.thread.is_alive():
            srv.__exit__()
        store.close()


def client(srv: RunningServer, headers: dict | None = None) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers=AUTH if headers is None else headers, timeout=60)


def idle(c: httpx.Client, user: str) -> dict:
    """Wait until the user's background work is done; return the status."""
    return wait_until(lambda: (st := c.get(f"/v1/users/{user}/status").json()) and not st["processing"] and st,
                      what=f"{user} to be processed")


def flushed(c: httpx.Client, user: str) -> dict:
    r = c.post(f"/v1/users/{user}/flush", params={"wait": "true"})
    assert r.status_code == 202 and r.json()["done"], r.text
    return idle(c, user)


# --------------------------------------------------------------------------- the happy path
def test_add_returns_at_once_then_background_builds_memory(make_server, lm):
    srv, memory = make_server()
    with client(srv) as c:
        r = c.post("/v1/users/alice/messages", json={"messages": messages(6)})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["accepted"] == 6 and body["ids"] == [f"d{i}" for i in range(6)] and body["pending"] == 6
        again = c.post("/v1/users/alice/messages", json={"messages": messages(6)}).json()
        assert again["accepted"] == 0 and again["duplicate_ids"] == body["ids"]
        st = idle(c, "alice")
        assert st["pending"] == 2 and st["episodes"] >= 1 and st["known"]   # one full window of 4 processed
        assert "counters" not in st
        st = flushed(c, "alice")
        assert st["pending"] == 0 and st["messages"] == 6 and st["healthy"]

        hits = c.post("/v1/users/alice/search", json={"query": "puppy called Rex"}).json()
        assert hits["episodes"] and hits["semantic"]
        ans = c.post("/v1/users/alice/answer", json={"question": "When did Alice talk about the puppy?"}).json()
        assert ans["answer"] == "7 May 2023" and ans["retrieved"]["episodes"]

        eps = c.get("/v1/users/alice/episodes").json()
        held = sorted(m["id"] for e in eps["episodes"] for m in e["messages"])
        assert held == [f"d{i}" for i in range(6)] and "vector" not in eps["episodes"][0]
        eid = eps["episodes"][0]["id"]
        assert c.get(f"/v1/users/alice/episodes/{eid}").json()["id"] == eid
        sem = c.get("/v1/users/alice/semantic").json()["semantic"]
        assert c.get(f"/v1/users/alice/semantic/{sem[0]['id']}").json()["text"] == sem[0]["text"]

        out = c.delete("/v1/users/alice/messages/d0").json()
        assert out["deleted"] == "d0" and out["episodes"]
        assert c.delete(f"/v1/users/alice/semantic/{sem[-1]['id']}").status_code in (200, 404)  # may be gone with d0
        st = flushed(c, "alice")
        assert st["messages"] == 5 and st["pending"] == 0
        remaining = c.get("/v1/users/alice/episodes").json()["episodes"]
        assert c.delete(f"/v1/users/alice/episodes/{remaining[0]['id']}").json() == {"deleted": remaining[0]["id"]}
        assert c.delete("/v1/users/alice").json() == {"deleted": "alice"}
        assert c.get("/v1/users/alice/status").json()["known"] is False
        assert c.post("/v1/users/alice/search", json={"query": "puppy"}).json() == {"episodes": [], "semantic": []}

        spec = c.get("/openapi.json").json()
        assert "/v1/users/{user_id}/messages" in spec["paths"] and "HTTPBearer" in str(spec["components"])


def test_metadata_filter_over_http(make_server):
    srv, _ = make_server()
    with client(srv) as c:
        msgs = messages(8)
        for i, m in enumerate(msgs):
            m["metadata"] = {"session": "s1" if i < 4 else "s2"}
        c.post("/v1/users/meta/messages", json={"messages": msgs})
        flushed(c, "meta")
        hits = c.post("/v1/users/meta/search", json={"query": "puppy", "metadata": {"session": "s2"}}).json()
        assert hits["episodes"] and all(set(e["message_ids"]) <= {f"d{i}" for i in range(4, 8)} for e in hits["episodes"])
        ep = c.get(f"/v1/users/meta/episodes/{hits['episodes'][0]['id']}").json()
        assert all(m["metadata"] == {"session": "s2"} for m in ep["messages"])


def test_delete_semantic_reports_sources_and_forget_removes_them_over_http(make_server):
    srv, _ = make_server()
    with client(srv) as c:
        c.post("/v1/users/fay/messages", json={"messages": messages(4)})
        flushed(c, "fay")
        sem = c.get("/v1/users/fay/semantic").json()["semantic"]
        first, second = sem[0], sem[1]
        out = c.delete(f"/v1/users/fay/semantic/{first['id']}").json()
        assert out == {"deleted": first["id"], "source_episodes": first["source_episode_ids"]}
        assert c.get(f"/v1/users/fay/episodes/{out['source_episodes'][0]}").status_code == 200  # still held
        gone = c.post(f"/v1/users/fay/semantic/{second['id']}/forget").json()
        assert gone["forgotten"] == second["id"] and set(second["source_episode_ids"]) <= set(gone["episodes"])
        assert sorted(gone["messages"]) == [f"d{i}" for i in range(4)]
        assert c.get("/v1/users/fay/episodes").json()["episodes"] == []
        assert c.post(f"/v1/users/fay/semantic/{second['id']}/forget").status_code == 404


def test_a_user_correction_is_a_new_version_and_the_history_lists_both(make_server):
    srv, _ = make_server()
    with client(srv) as c:
        c.post("/v1/users/gus/messages", json={"messages": messages(4)})
        flushed(c, "gus")
        old = c.get("/v1/users/gus/semantic").json()["semantic"][0]
        r = c.patch(f"/v1/users/gus/semantic/{old['id']}", json={"text": "Gus's dog is called Rex."})
        assert r.status_code == 200, r.text
        new = r.json()["entry"]
        assert r.json()["retired"] == old["id"] and r.json()["decision"] == "user_update"
        assert new["id"] != old["id"] and new["origin"] == "user_update" and new["supersedes"] == [old["id"]]
        assert (new["event_start"], new["source_episode_ids"]) == (old["event_start"], old["source_episode_ids"])
        assert "vector" not in new
        assert c.get(f"/v1/users/gus/semantic/{old['id']}").status_code == 404       # retired: not live any more
        listed = [e["id"] for e in c.get("/v1/users/gus/semantic").json()["semantic"]]
        assert new["id"] in listed and old["id"] not in listed
        hits = c.post("/v1/users/gus/search", json={"query": "Gus's dog is called Rex."}).json()["semantic"]
        assert hits[0]["id"] == new["id"] and old["id"] not in [h["id"] for h in hits]
        for asked in (old["id"], new["id"]):
            hist = c.get(f"/v1/users/gus/semantic/{asked}/history").json()
            assert hist["entry_id"] == asked and [v["id"] for v in hist["versions"]] == [old["id"], new["id"]]
        first, second = hist["versions"]
        assert (first["live"], first["retired_by"], first["retired_decision"]) == (False, new["id"], "user_update")
        assert first["retired_at"] and first["text"] == old["text"] and first["origin"] == "new"
        assert second["live"] and second["retired_at"] is None and second["event_end"] == old["event_end"]
        dated = c.patch(f"/v1/users/gus/semantic/{new['id']}", json={"text": "Gus adopted Rex.",
                                                                     "event_start": "2023-05-08T13:56:00"}).json()
        assert dated["entry"]["event_start"] == dated["entry"]["event_end"] == "2023-05-08T13:56:00"
        assert len(c.get(f"/v1/users/gus/semantic/{old['id']}/history").json()["versions"]) == 3
        for bad, code in [({"text": ""}, 422), ({"text": "x", "event_start": "not a date"}, 422),
                          ({"text": "x", "other": 1}, 422), ({"text": "x" * 40_000}, 422)]:
            assert c.patch(f"/v1/users/gus/semantic/{dated['entry']['id']}", json=bad).status_code == code, bad
        assert c.patch(f"/v1/users/gus/semantic/{old['id']}", json={"text": "x"}).status_code == 404
        assert c.get("/v1/users/gus/semantic/sem_nope/history").status_code == 404
        assert c.get(f"/v1/users/nobody/semantic/{old['id']}/history").status_code == 404   # another user
        assert c.patch(f"/v1/users/nobody/semantic/{old['id']}", json={"text": "x"}).status_code == 404
    with client(srv, {"Authorization": f"Bearer {user_token(TOKEN, 'amy')}"}) as amy:    # a user token of another
        assert amy.get(f"/v1/users/gus/semantic/{old['id']}/history").status_code == 403
        assert amy.patch(f"/v1/users/gus/semantic/{new['id']}", json={"text": "x"}).status_code == 403


# --------------------------------------------------------------------------- auth
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": "Basic " + TOKEN}], ids=["none", "wrong", "no-scheme", "basic"])
def test_missing_or_wrong_token_is_401_and_nothing_happens(make_server, lm, headers):
    srv, memory = make_server()
    with client(srv, headers) as c:
        for method, path, body in [("post", "/v1/users/eve/messages", {"messages": messages(8)}),
                                   ("post", "/v1/users/eve/flush", None), ("get", "/v1/users/eve/status", None),
                                   ("post", "/v1/users/eve/search", {"query": "x"}),
                                   ("post", "/v1/users/eve/answer", {"question": "x"}),
                                   ("get", "/v1/users/eve/episodes", None), ("delete", "/v1/users/eve", None),
                                   ("get", "/v1/status", None),
                                   ("post", "/v1/users/eve/messages", {"messages": [{"bad": 1}]})]:
            r = c.request(method, path, json=body)
            assert r.status_code == 401, (path, r.status_code, r.text)
            assert r.headers["www-authenticate"] == "Bearer" and "Fix:" in r.json()["error"]["message"]
        assert c.get("/v1/health").json() == {"ok": True}
    assert not memory.store.user_exists("eve") and memory.store.list_users() == []
    assert lm.calls == {}


def test_user_token_opens_only_that_user(make_server):
    srv, _ = make_server()
    with client(srv) as admin:
        admin.post("/v1/users/bob/messages", json={"messages": messages(2, "b")})
    with client(srv, {"Authorization": f"Bearer {user_token(TOKEN, 'amy')}"}) as amy:
        assert amy.post("/v1/users/amy/messages", json={"messages": messages(2, "a")}).status_code == 202
        assert amy.get("/v1/users/amy/status").json()["messages"] == 2
        for method, path in [("get", "/v1/users/bob/status"), ("get", "/v1/users/bob/episodes"),
                             ("delete", "/v1/users/bob"), ("get", "/v1/status")]:
            r = amy.request(method, path)
            assert r.status_code in (401, 403), path
    with client(srv) as admin:
        assert admin.get("/v1/users/bob/status").json()["messages"] == 2


def test_non_loopback_bind_needs_a_token():
    with pytest.raises(ConfigError, match="NEMORI_API_TOKEN"):
        check_bind("0.0.0.0", None)
    with pytest.raises(ConfigError):
        check_bind("192.168.1.5", "")
    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "a-token")


# --------------------------------------------------------------------------- isolation
def test_no_route_reads_or_changes_another_users_memory(make_server):
    srv, _ = make_server()
    with client(srv) as c:
        for user, prefix in (("ann", "a"), ("ben", "b")):
            c.post(f"/v1/users/{user}/messages", json={"messages": messages(6, prefix)})
            flushed(c, user)
        ann_eps = [e["id"] for e in c.get("/v1/users/ann/episodes").json()["episodes"]]
        ann_sem = [e["id"] for e in c.get("/v1/users/ann/semantic").json()["semantic"]]
        before = c.get("/v1/users/ann/status").json()
        assert ann_eps and ann_sem

        for eid in ann_eps:
            assert c.get(f"/v1/users/ben/episodes/{eid}").status_code == 404
            assert c.delete(f"/v1/users/ben/episodes/{eid}").status_code == 404
        for sid in ann_sem:
            assert c.get(f"/v1/users/ben/semantic/{sid}").status_code == 404
            assert c.delete(f"/v1/users/ben/semantic/{sid}").status_code == 404
        assert c.delete("/v1/users/ben/messages/a0").status_code == 404
        ben_text = str(c.get("/v1/users/ben/episodes").json()) + str(c.get("/v1/users/ben/semantic").json())
        ben_text += str(c.post("/v1/users/ben/search", json={"query": "a: let's talk about hiking"}).json())
        ben_text += str(c.post("/v1/users/ben/answer", json={"question": "a: what about hiking?"}).json())
        assert "a: let's" not in ben_text and not any(i in ben_text for i in ann_eps + ann_sem)
        # re-using ann's message ids under ben stores ben's own copies
        assert c.post("/v1/users/ben/messages", json={"messages": messages(1, "a")}).json()["accepted"] == 1
        c.delete("/v1/users/ben")
        after = c.get("/v1/users/ann/status").json()
        assert {k: after[k] for k in ("messages", "episodes", "semantic")} == \
            {k: before[k] for k in ("messages", "episodes", "semantic")}


# --------------------------------------------------------------------------- bad input and limits
@pytest.mark.parametrize("bad, field", [
    ({"content": ""}, "messages[0].content"),
    ({"content": "   "}, "messages[0].content"),
    ({"timestamp": "not a date at all"}, "messages[0].timestamp"),
    ({"timestamp": 12}, "messages[0].timestamp"),
    ({"speaker": ""}, "messages[0].speaker"),
    ({"metadata": {"k": [1]}}, "messages[0].metadata"),
    ({"extra": 1}, "messages[0].extra"),
], ids=["empty", "blank", "bad-timestamp", "number-timestamp", "no-speaker", "nested-metadata", "unknown-field"])
def test_bad_messages_are_422_naming_the_field(make_server, bad, field):
    srv, memory = make_server()
    with client(srv) as c:
        msg = {**messages(1)[0], **bad}
        r = c.post("/v1/users/val/messages", json={"messages": [messages(1, "ok")[0], msg][::-1]})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["field"].startswith(field) and "Fix:" in err["message"]
    assert not memory.store.user_exists("val")  # the whole batch is refused


def test_oversize_body_too_many_and_too_long_messages(make_server):
    srv, memory = make_server(limits=Limits(max_body_bytes=20_000, max_messages=50, max_message_chars=500))
    with client(srv) as c:
        big = c.post("/v1/users/lim/messages", json={"messages": messages(200)})
        assert big.status_code == 413 and "split" in big.json()["error"]["message"]
        chunked = c.post("/v1/users/lim/messages", content=iter([b'{"messages": [', b" " * 30_000, b"]}"]),
                         headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
        many = c.post("/v1/users/lim/messages", json={"messages": [{**m, "content": "x"} for m in messages(60)]})
        assert many.status_code == 413 and "50" in many.json()["error"]["message"]
        long = c.post("/v1/users/lim/messages", json={"messages": [{**messages(1)[0], "content": "y" * 501}]})
        assert long.status_code == 422 and long.json()["error"]["field"] == "messages[0].content"
        q = c.post("/v1/users/lim/search", json={"query": "q" * 5000})
        assert q.status_code == 422 and q.json()["error"]["field"] == "query"
        assert c.post("/v1/users/lim/search", json={"query": ""}).status_code == 422
        assert c.post("/v1/users/lim/messages", content=b"{not json", headers={"Content-Type": "application/json"}
                      ).status_code == 422
    assert not memory.store.user_exists("lim")


def test_ten_thousand_message_batch_is_accepted_whole(make_server):
    srv, memory = make_server(threads=0)  # store only: processing 10k messages is not this test's business
    batch = messages(10_000)
    with client(srv) as c:
        r = c.post("/v1/users/bulk/messages", json={"messages": batch})
        assert r.status_code == 202, r.text[:300]
        assert r.json()["accepted"] == 10_000 and len(set(r.json()["ids"])) == 10_000
        st = c.get("/v1/users/bulk/status").json()
        assert st["messages"] == 10_000 and st["pending"] == 10_000
        assert (st["processing"], st["passes"], st["last_error"]) == (False, 0, None)  # a store-only node never runs
        assert c.get("/v1/status").json()["worker"] == {"threads": 0, "users_processing": 0, "stopping": False}
        too_big = c.post("/v1/users/bulk/messages", json={"messages": messages(10_001, "z")})
        assert too_big.status_code == 413                   # refused whole: nothing of it stored
    stored = memory.store.pending_messages("bulk")
    assert [m.id for m in stored] == [m["id"] for m in batch]   # every one, in order
    assert memory.store.stats("bulk")["messages"] == 10_000


@pytest.mark.parametrize("user_id", ["../../etc", "../../etc/passwd", "a/b", "x\ny", "nul\x00", "\x7f", "a" * 300, " "])
def test_hostile_user_ids_are_refused(make_server, tmp_path: Path, user_id):
    srv, memory = make_server()
    files = sorted(p.name for p in tmp_path.iterdir())
    with client(srv) as c:
        r = c.post(f"/v1/users/{quote(user_id, safe='')}/messages", json={"messages": messages(1)})
        assert r.status_code in (404, 422), (user_id, r.status_code)
        if r.status_code == 422:
            assert r.json()["error"]["field"] == "user_id"
    assert memory.store.list_users() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == files


@pytest.mark.parametrize("user_id", ["robert'); DROP TABLE users;--", "' OR 1=1 --", "ünïcødé 用户", "..", "%2e%2e"])
def test_odd_but_valid_user_ids_are_inert(make_server, user_id):
    srv, memory = make_server()
    with client(srv) as c:
        c.post("/v1/users/bystander/messages", json={"messages": messages(2, "b")})
        r = c.post(f"/v1/users/{quote(user_id, safe='')}/messages", json={"messages": messages(2)})
        if user_id == "..":  # dot segments are resolved by the client/router: never reaches a user
            assert r.status_code == 404
            return
        assert r.status_code == 202, r.text
        assert c.get(f"/v1/users/{quote(user_id, safe='')}/status").json()["messages"] == 2
        assert c.get("/v1/users/bystander/status").json()["messages"] == 2
    assert memory.store.stats("bystander")["messages"] == 2


# --------------------------------------------------------------------------- restart
def test_pending_work_is_picked_up_after_a_restart(make_server, tmp_path: Path, lm):
    db = tmp_path / "restart.db"
    first, _ = make_server(threads=0, db=db)     # accepts and stores, processes nothing
    with client(first) as c:
        assert c.post("/v1/users/rita/messages", json={"messages": messages(9)}).json()["pending"] == 9
    first.__exit__()
    assert lm.calls == {}

    second, memory = make_server(threads=2, db=db)   # no request: the worker finds the stored work
    with client(second) as c:
        st = wait_until(lambda: (s := c.get("/v1/users/rita/status").json())["pending"] == 1 and
                        not s["processing"] and s, what="resumed processing")
        assert st["episodes"] >= 2 and st["messages"] == 9
        held = sorted(m["id"] for e in c.get("/v1/users/rita/episodes").json()["episodes"] for m in e["messages"])
        assert held == sorted(f"d{i}" for i in range(8))   # two windows of 4, in arrival order; d8 waits
