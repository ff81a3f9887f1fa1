"""MCP server end to end: the ``mcp`` SDK's client talks to ``nemori-dspy serve mcp`` in a subprocess
(``tests.serve_entry``: the real CLI with a ScriptedLM, HashingEmbedder, SQLite file), over stdio and over
streamable HTTP with the SDK's bearer-token verification (server token, per-user tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from nemori_dspy.apps.serving.auth import user_token
from nemori_dspy.apps.serving.mcp import TOOL_ANNOTATIONS
from tests.fakes import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"remember", "search_memory", "answer_from_memory", "forget", "list_memories", "memory_status",
         "delete_all_memories"}
TOKEN = "mcp-test-token"


def params(db: Path, *extra: str) -> StdioServerParameters:
    env = {"NEMORI_EMBEDDER": "hashing-64", "NEMORI_WINDOW_SIZE": "4", "PYTHONPATH": str(ROOT),
           "NEMORI_CACHE_DIR": str(db.parent / "cache"), "HOME": os.environ.get("HOME", str(db.parent))}
    return StdioServerParameters(command=sys.executable, args=["-m", "tests.serve_entry", "serve", "mcp",
                                                                "--db", str(db), *extra], env=env, cwd=str(ROOT))


def payload(result) -> dict:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content.get("result", result.structured_content)
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error, result.content
    return result.content[0].text


async def settled(c: Client, args: dict, timeout: float = 60.0) -> dict:
    """``memory_status`` once the background work of ``remember`` is done."""
    deadline = time.monotonic() + timeout
    while True:
        st = payload(await c.call_tool("memory_status", args))
        if not st["processing"] or time.monotonic() > deadline:
            return st
        await anyio.sleep(0.05)


async def session_per_call_user(db: Path) -> dict:
    async with Client(params(db), read_timeout_seconds=120) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == TOOLS
        assert "user_id" in tools["search_memory"].input_schema["properties"]
        assert "metadata" in tools["search_memory"].input_schema["properties"]
        stored = payload(await c.call_tool("remember", {"user_id": "ada", "messages": [
            {"content": "My sister Eva lives in Porto", "id": "a1", "timestamp": "2024-01-02T10:00:00",
             "metadata": {"agent_id": "planner"}}]}))
        assert stored == {"stored": ["a1"], "duplicates": [], "pending": 1, "queued": True}   # returned at once
        st = await settled(c, {"user_id": "ada"})
        assert st["episodes"] == 1 and st["pending"] == 0 and st["passes"] >= 1 and st["last_error"] is None
        payload(await c.call_tool("remember", {"user_id": "ada", "messages": [
            {"content": "I am learning the cello", "id": "a2", "timestamp": "2024-01-03T10:00:00",
             "metadata": {"agent_id": "coach"}}]}))
        payload(await c.call_tool("remember", {"user_id": "bo", "messages": [{"content": "I play the cello"}]}))
        await settled(c, {"user_id": "ada"})
        await settled(c, {"user_id": "bo"})
        out = {"tools": tools,
               "hits": payload(await c.call_tool("search_memory", {"user_id": "ada", "query": "sister Porto"})),
               "coach": payload(await c.call_tool("search_memory", {"user_id": "ada", "query": "sister Porto cello",
                                                                    "metadata": {"agent_id": "coach"}})),
               "other": payload(await c.call_tool("search_memory", {"user_id": "bo", "query": "sister Porto"})),
               "answer": payload(await c.call_tool("answer_from_memory", {"user_id": "ada",
                                                                          "question": "Where does Eva live?"})),
               "facts": payload(await c.call_tool("list_memories", {"user_id": "ada"})),
               "episodes": payload(await c.call_tool("list_memories", {"user_id": "ada", "kind": "episodes",
                                                                       "limit": 1})),
               "bad": await c.call_tool("remember", {"user_id": "ada", "messages": [{"content": " "}]}),
               "bad_user": await c.call_tool("search_memory", {"user_id": "x\ny", "query": "q"}),
               "bad_kind": await c.call_tool("list_memories", {"user_id": "ada", "kind": "all"})}
        # bo's fact: forgetting it removes bo's conversation too, ada's stays for session 2
        out["gone"] = payload(await c.call_tool("forget", {"user_id": "bo", "entry_id": out["other"]["semantic"][0]["id"]}))
        payload(await c.call_tool("remember", {"user_id": "cy", "messages": [{"content": "Delete me later"}]}))
        await settled(c, {"user_id": "cy"})
        out["refused"] = [await c.call_tool("delete_all_memories", {"user_id": "cy", "confirm": confirm})
                          for confirm in ("yes", "CY", "")]
        out["still"] = payload(await c.call_tool("memory_status", {"user_id": "cy"}))
        out["erased"] = payload(await c.call_tool("delete_all_memories", {"user_id": "cy", "confirm": "cy"}))
        out["after"] = payload(await c.call_tool("memory_status", {"user_id": "cy"}))
        return out


def test_mcp_stdio_tools_per_call_user(tmp_path: Path):
    out = anyio.run(session_per_call_user, tmp_path / "mcp.db")
    for name, tool in out["tools"].items():                       # the SDK's ToolAnnotations reach the client
        assert tool.annotations == TOOL_ANNOTATIONS[name], name
    read_only = {n for n, t in out["tools"].items() if t.annotations.read_only_hint}
    destructive = {n for n, t in out["tools"].items() if t.annotations.destructive_hint}
    assert read_only == {"search_memory", "answer_from_memory", "list_memories", "memory_status"}
    assert destructive == {"forget", "delete_all_memories"}
    assert out["hits"]["episodes"] and "Porto" in out["hits"]["episodes"][0]["narrative"]
    coach = json.dumps(out["coach"])                              # the metadata filter: the coach's episode only
    assert "cello" in coach and "Porto" not in coach and out["coach"]["semantic"]
    assert all("Porto" not in json.dumps(h) for h in out["other"]["episodes"])   # bo sees only bo
    assert out["answer"]["answer"] == "7 May 2023" and out["answer"]["episode_ids"]
    facts = out["facts"]
    assert facts["kind"] == "semantic" and facts["total"] == len(facts["items"]) >= 2
    assert {"id", "text", "event_start", "origin"} <= set(facts["items"][0]) and facts["items"][0]["origin"] == "new"
    assert out["episodes"]["total"] == 2 and len(out["episodes"]["items"]) == 1
    assert "messages[0].content" in error_text(out["bad"])
    assert "user_id" in error_text(out["bad_user"]) and "kind" in error_text(out["bad_kind"]).lower()
    assert out["gone"]["deleted"] == "semantic" and out["gone"]["messages"] and out["gone"]["episodes"]
    assert all("confirm" in error_text(r) for r in out["refused"])    # nothing deleted without the user id
    assert out["still"]["known"] and out["still"]["messages"] == 1
    assert out["erased"] == {"deleted_user": "cy", "messages": 1, "episodes": 1,
                             "semantic": out["still"]["semantic"]}
    assert not out["after"]["known"] and out["after"]["messages"] == 0


async def session_fixed_user(db: Path) -> tuple[dict, dict, dict]:
    async with Client(params(db, "--user", "ada"), read_timeout_seconds=120) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == TOOLS
        assert all("user_id" not in t.input_schema.get("properties", {}) for t in tools.values())
        assert tools["delete_all_memories"].annotations.destructive_hint
        return payload(await c.call_tool("search_memory", {"query": "sister Porto"})), \
            payload(await c.call_tool("answer_from_memory", {"question": "Where does Eva live?"})), \
            payload(await c.call_tool("memory_status", {}))


def test_mcp_fixed_user_recalls_an_earlier_session(tmp_path: Path):
    db = tmp_path / "mcp.db"
    anyio.run(session_per_call_user, db)            # session 1 (its own server process)
    hits, ans, st = anyio.run(session_fixed_user, db)   # session 2: a new process, --user ada
    assert any("Porto" in e["narrative"] for e in hits["episodes"])
    assert ans["episode_ids"] and st["user_id"] == "ada" and st["episodes"] == 2


# --------------------------------------------------------------------------- streamable HTTP
@contextmanager
def http_server(db: Path, *extra: str) -> Iterator[str]:
    """``serve mcp --http`` in a subprocess with ``NEMORI_API_TOKEN``; yields the MCP URL."""
    port = free_port()
    p = params(db, "--http", "--port", str(port), *extra)
    proc = subprocess.Popen([p.command, *p.args], cwd=p.cwd, env={**os.environ, **p.env, "NEMORI_API_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        def up() -> bool:
            try:
                return httpx.post(url, json={}, timeout=2).status_code == 401
            except httpx.TransportError:
                return False
        wait_until(up, what="MCP HTTP server")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def http_calls(url: str, token: str, calls: list[tuple[str, dict]]) -> list:
    """One MCP session with ``token``: the raw results of ``calls`` (waiting for remember's work to settle)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    results = []
    async with http, Client(streamable_http_client(url, http_client=http)) as c:
        for name, args in calls:
            results.append(await c.call_tool(name, args))
            if name == "remember" and not results[-1].is_error:
                await settled(c, {k: v for k, v in args.items() if k == "user_id"})
    return results


def status_code(url: str, token: str) -> int:
    return httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
                      timeout=30).status_code


def test_mcp_streamable_http_verifies_server_and_per_user_tokens(tmp_path: Path):
    hal, bo = user_token(TOKEN, "hal"), user_token(TOKEN, "bo")
    jazz = ("remember", {"user_id": "hal", "messages": [{"content": "I like jazz"}]})
    with http_server(tmp_path / "mcp.db") as url:
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert status_code(url, "nu_" + "0" * 63) == 401                      # not a token of ours at all
        # the server token opens every user
        _, hits, _ = anyio.run(http_calls, url, TOKEN, [
            jazz, ("search_memory", {"user_id": "hal", "query": "jazz"}),
            ("remember", {"user_id": "bo", "messages": [{"content": "I like folk"}]})])
        assert not hits.is_error and "jazz" in payload(hits)["episodes"][0]["narrative"]
        # hal's token opens hal's memory only: every tool naming bo is refused, and nothing of bo's changes
        own, status, other, other_status, erase = anyio.run(http_calls, url, hal, [
            ("search_memory", {"user_id": "hal", "query": "jazz"}), ("memory_status", {"user_id": "hal"}),
            ("search_memory", {"user_id": "bo", "query": "folk"}), ("memory_status", {"user_id": "bo"}),
            ("delete_all_memories", {"user_id": "bo", "confirm": "bo"})])
        assert "jazz" in payload(own)["episodes"][0]["narrative"] and payload(status)["episodes"] == 1
        for refused in (other, other_status, erase):
            assert "another user" in error_text(refused)
        (folk,) = anyio.run(http_calls, url, bo, [("search_memory", {"user_id": "bo", "query": "folk"})])
        assert "folk" in payload(folk)["episodes"][0]["narrative"]           # bo's own token still finds it
    with http_server(tmp_path / "mcp.db", "--user", "hal") as url:              # a server for hal only
        assert status_code(url, bo) == 401 and status_code(url, hal) != 401 and status_code(url, TOKEN) != 401
        (mine,) = anyio.run(http_calls, url, hal, [("search_memory", {"query": "jazz"})])
        assert "jazz" in payload(mine)["episodes"][0]["narrative"]


@pytest.mark.parametrize("token, opens", [(TOKEN, True), (user_token(TOKEN, "hal"), True), ("nope", False),
                                          (user_token("another-server", "hal"), None)])
def test_token_verifier_scopes(token, opens):
    from nemori_dspy.apps.serving.mcp import SCOPE_ALL_USERS, SCOPE_ONE_USER, NemoriTokenVerifier

    open_to_all = anyio.run(NemoriTokenVerifier(TOKEN).verify_token, token)
    for_hal = anyio.run(NemoriTokenVerifier(TOKEN, "hal").verify_token, token)
    if opens is False:
        assert open_to_all is None and for_hal is None
    elif opens is None:       # well formed, of no user of this server: admitted, then refused by every tool call
        assert open_to_all.scopes == [SCOPE_ONE_USER] and for_hal is None
    else:
        assert open_to_all.scopes == [SCOPE_ALL_USERS if token == TOKEN else SCOPE_ONE_USER]
        assert for_hal is not None and for_hal.client_id == open_to_all.client_id != TOKEN
