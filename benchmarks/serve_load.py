"""Load test of the REST API: N concurrent clients add messages and search for M users.

The server is the real CLI (``nemori-dspy serve http``) in a subprocess, with a ScriptedLM standing in
for the LLM (``tests.serve_entry``) and the hashing embedder, on a fresh SQLite file. Each client
owns a slice of message ids; every message names its user (``<user-3>``). At the end every user is
flushed and the run checks: 0 lost (each user's episodes hold exactly the messages sent for them,
each once) and 0 cross-user reads (no search result of a user contains another user's tag).

usage: python -m benchmarks.serve_load [--clients 16] [--users 8] [--rounds 10] [--batch 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from benchmarks.results_io import cli_description

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "load-test-token"
TAG = re.compile(r"<user-\d+>")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, port: int, window: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "NEMORI_EMBEDDER": "hashing-64", "NEMORI_WINDOW_SIZE": str(window),
           "NEMORI_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "NEMORI_CACHE_DIR": str(db.parent / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.serve_entry", "serve", "http", "--db", str(db),
                             "--port", str(port), "--threads", str(threads)], cwd=ROOT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


async def client(c: httpx.AsyncClient, cid: int, users: int, rounds: int, batch: int,
                 lat: dict[str, list[float]], sent: dict[str, set[str]], leaks: list[str]) -> None:
    t0 = datetime(2024, 1, 1)
    for r in range(rounds):
        user = f"user-{(cid + r) % users}"
        msgs = [{"speaker": "user", "id": f"c{cid}-r{r}-{i}", "timestamp": (t0 + timedelta(minutes=cid * 1000 + r * 10 + i)).isoformat(),
                 "content": f"<{user}> client {cid} round {r} line {i}: notes about hiking and pottery"}
                for i in range(batch)]
        start = time.perf_counter()
        resp = await c.post(f"/v1/users/{user}/messages", json={"messages": msgs})
        lat["add"].append(time.perf_counter() - start)
        resp.raise_for_status()
        sent[user].update(m["id"] for m in msgs)
        start = time.perf_counter()
        resp = await c.post(f"/v1/users/{user}/search", json={"query": "hiking and pottery notes", "top_k": 5})
        lat["search"].append(time.perf_counter() - start)
        resp.raise_for_status()
        leaks += [t for t in TAG.findall(resp.text) if t != f"<{user}>"]


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000 if len(xs) > 1 else (xs[0] * 1000 if xs else 0.0)


async def run(args: argparse.Namespace, base: str) -> int:
    lat: dict[str, list[float]] = {"add": [], "search": []}
    sent: dict[str, set[str]] = {f"user-{u}": set() for u in range(args.users)}
    leaks: list[str] = []
    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300,
                                 limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, i, args.users, args.rounds, args.batch, lat, sent, leaks)
                               for i in range(args.clients)))
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        for user in sent:
            (await c.post(f"/v1/users/{user}/flush", params={"wait": "true", "timeout_s": 3600})).raise_for_status()
        drain = time.perf_counter() - t1
        lost = dup = 0
        for user, ids in sent.items():
            eps = (await c.get(f"/v1/users/{user}/episodes", params={"limit": 1000})).json()["episodes"]
            held = [m["id"] for e in eps for m in e["messages"]]
            lost += len(ids - set(held))
            dup += len(held) - len(set(held))
            leaks += [t for e in eps for t in TAG.findall(str(e)) if t != f"<{user}>"]
            st = (await c.get(f"/v1/users/{user}/status")).json()
            lost += max(0, len(ids) - st["messages"])
    n = len(lat["add"]) + len(lat["search"])
    print(f"{args.clients} clients x {args.rounds} rounds, {args.users} users, {args.batch} messages per add "
          f"(window {args.window}, {args.threads} worker threads)")
    print(f"{n} requests in {wall:.2f} s = {n / wall:.1f} requests/s")
    for kind, xs in lat.items():
        print(f"  {kind:6s} n={len(xs)}  p50 {pct(xs, 50):.1f} ms  p95 {pct(xs, 95):.1f} ms")
    total = sum(len(v) for v in sent.values())
    print(f"background processing drained {total} messages in {drain:.1f} s after the load")
    print(f"lost {lost}, duplicated {dup}, cross-user reads {len(leaks)}")
    return 0 if lost == dup == len(leaks) == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=cli_description(__doc__))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batch", type=int, default=5)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = start_server(Path(tmp) / "load.db", port, args.window, args.threads)
        try:
            return asyncio.run(run(args, f"http://127.0.0.1:{port}"))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
