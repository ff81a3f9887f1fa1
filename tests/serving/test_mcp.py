"""MCP server end to end: the ``mcp`` SDK's client talks over stdio to ``nemori-dspy serve mcp`` in a
subprocess (``tests.serve_entry``: the real CLI with a ScriptedLM, HashingEmbedder, SQLite file)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parents[2]


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


async def session_per_call_user(db: Path) -> dict:
    async with Client(params(db), read_timeout_seconds=120) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == {"remember", "search_memory", "answer_from_memory", "forget"}
        assert "user_id" in tools["search_memory"].input_schema["properties"]
        stored = payload(await c.call_tool("remember", {"user_id": "ada", "messages": [
            {"content": "My sister Eva lives in Porto", "id": "a1", "timestamp": "2024-01-02T10:00:00"}]}))
        assert stored["stored"] == ["a1"] and stored["episodes"] == 1
        payload(await c.call_tool("remember", {"user_id": "bo", "messages": [{"content": "I play the cello"}]}))
        hits = payload(await c.call_tool("search_memory", {"user_id": "ada", "query": "sister Porto"}))
        other = payload(await c.call_tool("search_memory", {"user_id": "bo", "query": "sister Porto"}))
        ans = payload(await c.call_tool("answer_from_memory", {"user_id": "ada", "question": "Where does Eva live?"}))
        bad = await c.call_tool("remember", {"user_id": "ada", "messages": [{"content": " "}]})
        bad_user = await c.call_tool("search_memory", {"user_id": "x\ny", "query": "q"})
        # bo's fact: forgetting it removes bo's conversation too, ada's stays for session 2
        gone = payload(await c.call_tool("forget", {"user_id": "bo", "entry_id": other["semantic"][0]["id"]}))
        return {"hits": hits, "other": other, "answer": ans, "bad": bad, "bad_user": bad_user, "gone": gone}


def test_mcp_stdio_tools_per_call_user(tmp_path: Path):
    out = anyio.run(session_per_call_user, tmp_path / "mcp.db")
    assert out["hits"]["episodes"] and "Porto" in out["hits"]["episodes"][0]["narrative"]
    assert all("Porto" not in json.dumps(h) for h in out["other"]["episodes"])   # bo sees only bo
    assert out["answer"]["answer"] == "7 May 2023" and out["answer"]["episode_ids"]
    assert out["bad"].is_error and "messages[0].content" in out["bad"].content[0].text
    assert out["bad_user"].is_error and "user_id" in out["bad_user"].content[0].text
    assert out["gone"]["deleted"] == "semantic" and out["gone"]["messages"] and out["gone"]["episodes"]


async def session_fixed_user(db: Path) -> tuple[dict, dict]:
    async with Client(params(db, "--user", "ada"), read_timeout_seconds=120) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert "user_id" not in tools["search_memory"].input_schema.get("properties", {})
        return payload(await c.call_tool("search_memory", {"query": "sister Porto"})), \
            payload(await c.call_tool("answer_from_memory", {"question": "Where does Eva live?"}))


def test_mcp_fixed_user_recalls_an_earlier_session(tmp_path: Path):
    db = tmp_path / "mcp.db"
    anyio.run(session_per_call_user, db)            # session 1 (its own server process)
    hits, ans = anyio.run(session_fixed_user, db)   # session 2: a new process, --user ada
    assert any("Porto" in e["narrative"] for e in hits["episodes"])
    assert ans["episode_ids"]


async def http_session(url: str, token: str) -> dict:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    async with http, Client(streamable_http_client(url, http_client=http)) as c:
        payload(await c.call_tool("remember", {"user_id": "hal", "messages": [{"content": "I like jazz"}]}))
        return payload(await c.call_tool("search_memory", {"user_id": "hal", "query": "jazz"}))


def test_mcp_streamable_http_needs_the_bearer_token(tmp_path: Path):
    import subprocess

    import httpx

    from tests.fakes import free_port, wait_until

    port, token = free_port(), "mcp-test-token"
    p = params(tmp_path / "mcp.db", "--http", "--port", str(port))
    proc = subprocess.Popen([p.command, *p.args], cwd=p.cwd, env={**os.environ, **p.env, "NEMORI_API_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        def up() -> bool:
            try:
                return httpx.post(url, json={}, timeout=2).status_code == 401
            except httpx.TransportError:
                return False
        wait_until(up, what="MCP HTTP server")
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        hits = anyio.run(http_session, url, token)
        assert hits["episodes"] and "jazz" in hits["episodes"][0]["narrative"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
