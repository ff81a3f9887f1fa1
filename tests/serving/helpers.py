"""Run a real uvicorn server in a thread on 127.0.0.1 (free port) for HTTP tests."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime, timedelta
from typing import Any, Callable

import uvicorn

T0 = datetime(2023, 5, 7, 13, 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """``with RunningServer(app) as srv:`` → ``srv.url``; stopped (lifespan shutdown) on exit."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "RunningServer":
        self.thread.start()
        wait_until(lambda: self.server.started, what="uvicorn to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def wait_until(cond: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    """Poll ``cond`` until truthy (a liveness guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def messages(n: int, prefix: str = "d", start: int = 0) -> list[dict]:
    topics = ["hiking in the alps", "a new puppy called Rex", "the pottery class", "moving to Lisbon"]
    return [{"speaker": "Alice" if i % 2 == 0 else "Bob", "id": f"{prefix}{i}",
             "content": f"{prefix}: let's talk about {topics[i % len(topics)]} (line {i})",
             "timestamp": (T0 + timedelta(minutes=i)).isoformat()} for i in range(start, start + n)]
