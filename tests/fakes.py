"""Test doubles and fixture paths shared by the test suite.

The scripted LM (``ScriptedLM``: replies from Python functions per signature, parsed by the real DSPy
adapters through the real ``dspy.LM`` call path) lives in ``nemori_dspy.testing`` so the benchmarks can use
it without importing the tests; it is re-exported here. Tests import shared helpers from this module (or
get them as fixtures from ``tests/conftest.py``), never from another test module.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nemori_dspy.testing import (
    ROUTES,
    Responder,
    ScriptedLM,
    chat_reply,
    default_responders,
    field_key,
    parse_inputs,
    prompt_hash,
    replay_responders,
    signature_fields,
)

__all__ = [
    "DATA_DIR",
    "ROUTES",
    "Responder",
    "SYNTHETIC_LOCOMO",
    "SYNTHETIC_MINI",
    "ScriptedLM",
    "TableEmbedder",
    "chat_reply",
    "default_responders",
    "field_key",
    "parse_inputs",
    "prompt_hash",
    "real_locomo_mini",
    "replay_responders",
    "signature_fields",
    "unit_vector",
    "RunningServer",
    "free_port",
    "messages",
    "wait_until",
]

#: tests/data: fixture files written for this project (no third-party dataset text; see its README.md).
DATA_DIR = Path(__file__).resolve().parent / "data"
#: One conversation in LoCoMo's schema, the size of locomo_mini.json (3 sessions, 56 turns, 25 QA items;
#: written by tests/data/make_synthetic.py). The end-to-end tests run on it, so they need no ../shared.
SYNTHETIC_MINI = DATA_DIR / "synthetic_mini.json"
#: Three short LoCoMo-schema conversations (optimizer tests).
SYNTHETIC_LOCOMO = DATA_DIR / "synthetic_locomo.json"


def real_locomo_mini() -> Path | None:
    """The real LoCoMo ``locomo_mini.json`` (CC BY-NC, not in this repo), or None when absent.

    Looked for in ``$NEMORI_LOCOMO_DIR``, then in ``../shared/data/locomo`` beside the checkout. Only the
    real-data tests (marker ``real_data``) use it; they skip without it.
    """
    dirs = [Path(os.environ["NEMORI_LOCOMO_DIR"])] if os.environ.get("NEMORI_LOCOMO_DIR") else []
    dirs.append(Path(__file__).resolve().parents[2] / "shared/data/locomo")
    return next((d / "locomo_mini.json" for d in dirs if (d / "locomo_mini.json").is_file()), None)


class TableEmbedder:
    """Embedder with hand-set 3-d vectors per exact text (unknown text → [0, 0, 1]); rows are unit-normed."""

    name, dim = "table-3", 3

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def embed(self, texts):
        rows = np.asarray([self.table.get(t, [0.0, 0.0, 1.0]) for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def unit_vector(deg: float) -> list[float]:
    """Unit vector in the x-y plane at ``deg`` degrees from the x axis (cosine to x = cos(deg))."""
    r = np.deg2rad(deg)
    return [float(np.cos(r)), float(np.sin(r)), 0.0]


# ---------------------------------------------------------------- HTTP server tests (tests/serving)
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timedelta  # noqa: E402
from typing import Any, Callable  # noqa: E402

T0 = datetime(2023, 5, 7, 13, 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """``with RunningServer(app) as srv:`` → ``srv.url``; stopped (lifespan shutdown) on exit."""

    def __init__(self, app: Any) -> None:
        import uvicorn  # the serve extra; only HTTP tests need it

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
