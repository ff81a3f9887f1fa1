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
    "LongMemEvalLM",
    "install_scripted_runtime",
    "lme_responders",
    "longmemeval_file",
    "longmemeval_questions",
    "write_json",
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


# ---------------------------------------------------------------- LongMemEval judges
class LongMemEvalLM(ScriptedLM):
    """ScriptedLM that also routes the five LongMemEval judge prompts (checked before the field routes:
    three of them share their fields, so they are told apart by a phrase of their instruction)."""

    LME_ROUTES = {
        "JudgeLongMemEvalDefault": "answers a memory question correctly",
        "JudgeLongMemEvalTemporal": "answers a temporal-reasoning question correctly",
        "JudgeLongMemEvalKnowledgeUpdate": "gives the up-to-date answer",
        "JudgeLongMemEvalPreference": "personalised as a rubric describes",
        "JudgeLongMemEvalAbstention": "identifies an unanswerable question as unanswerable",
    }

    def route(self, system: str) -> str:
        hits = [name for name, phrase in self.LME_ROUTES.items() if phrase in system]
        if hits:
            assert len(hits) == 1, f"ambiguous route: {hits}"
            return hits[0]
        return super().route(system)


# ---------------------------------------------------------------- LongMemEval files and replies
import copy  # noqa: E402
import json  # noqa: E402

def longmemeval_questions() -> list[dict]:
    """Three LongMemEval_S questions in the official schema (written for this project)."""
    return [
        {
            "question_id": "q-temporal",
            "question_type": "temporal-reasoning",
            "question": "How many days passed between buying the bike and the first ride?",
            "answer": 3,  # some official answers are ints
            "question_date": "2023/05/30 (Tue) 23:40",
            "haystack_session_ids": ["sharegpt_noise_1", "answer_bike_1"],
            "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/25 (Thu) 14:05"],
            "haystack_sessions": [
                [
                    {"role": "user", "content": "Give me a pasta recipe."},
                    {"role": "assistant", "content": "Boil water, add pasta."},
                ],
                [
                    {"role": "user", "content": "I bought a bike on May 22.", "has_answer": True},
                    {"role": "assistant", "content": "Nice!", "has_answer": False},
                    {"role": "user", "content": "First ride was on May 25.", "has_answer": True},
                ],
            ],
            "answer_session_ids": ["answer_bike_1"],
        },
        {
            "question_id": "q-pref",
            "question_type": "single-session-preference",
            "question": "Can you suggest a weekend activity?",
            "answer": "The user would prefer outdoor suggestions related to hiking.",
            "question_date": "2023/06/02 (Fri) 09:00",
            "haystack_session_ids": ["answer_hike_1", "ultrachat_2"],
            "haystack_dates": ["2023/05/01 (Mon) 10:00", "2023/05/03 (Wed) 11:30"],
            "haystack_sessions": [
                [
                    {"role": "user", "content": "I love hiking in the Alps.", "has_answer": True},
                    {"role": "assistant", "content": "Sounds great."},
                ],
                [
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "   "},  # blank turn: skipped, ids keep positions
                    {"role": "user", "content": "Thanks."},
                ],
            ],
            "answer_session_ids": ["answer_hike_1"],
        },
        {
            "question_id": "q-ku_abs",
            "question_type": "knowledge-update",
            "question": "What is the name of my new cat?",
            "answer": "You mentioned adopting a dog, not a cat.",
            "question_date": "2023/07/01 (Sat) 12:00",
            # oracle-style: not sorted by time
            "haystack_session_ids": ["answer_pet_2", "answer_pet_1"],
            "haystack_dates": ["2023/06/20 (Tue) 08:00", "2023/06/10 (Sat) 08:00"],
            "haystack_sessions": [
                [{"role": "user", "content": "The dog is now called Rex."}],
                [{"role": "user", "content": "I adopted a dog named Max."}],
            ],
            "answer_session_ids": ["answer_pet_1", "answer_pet_2"],
        },
    ]


def write_json(tmp_path: Path, data, name: str = "longmemeval_s_mini.json") -> Path:
    """``data`` as JSON in ``tmp_path/name``; returns the path."""
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def longmemeval_file(tmp_path):
    """The loader tests' three questions plus a second temporal one (so the audit has a same-type wrong answer)."""
    data = longmemeval_questions()
    second = copy.deepcopy(data[0])
    second.update(question_id="q-temporal-2", question="How long did the bike ride last?", answer="12 days")
    return write_json(tmp_path, [*data, second])


def lme_responders() -> dict:
    """Pipeline replies plus judges that say yes when the gold's first word is in the answer; P_ans answers
    '3 days' to the bike question and declines the cat one."""
    def contains(field: str):
        return lambda i: chat_reply(label="yes" if i[field].split()[0].lower() in i["generated_answer"].lower()
                                    else "no")

    def answer(i):
        q = i["question"]
        return chat_reply(answer="3 days" if "bike" in q and "How many" in q else
                          "You never mentioned a cat, it is not known." if "cat" in q else "Try hiking.")

    return {**default_responders(), "AnswerQuestion": answer,
            "JudgeLongMemEvalDefault": contains("gold_answer"), "JudgeLongMemEvalTemporal": contains("gold_answer"),
            "JudgeLongMemEvalKnowledgeUpdate": contains("gold_answer"),
            "JudgeLongMemEvalPreference": lambda i: chat_reply(label="yes" if "hiking" in i["generated_answer"] else "no"),
            "JudgeLongMemEvalAbstention": lambda i: chat_reply(label="yes" if "not" in i["generated_answer"] else "no")}


# ---------------------------------------------------------------- CLI tests: the runtime swapped for a scripted LM
def install_scripted_runtime(monkeypatch: Any, cache_dir: Path, lm: Any) -> Any:
    """Make ``nemori_dspy.runtime.build_runtime`` configure ``lm`` (no server, no network) and point
    ``NEMORI_CACHE_DIR`` at ``cache_dir``, for tests that drive ``nemori_dspy.apps.cli.main``. Returns ``lm``."""
    import dspy

    import nemori_dspy.runtime as runtime

    def fake_build(settings: Any, configure: bool = True) -> Any:
        dspy.configure(lm=lm, adapter=dspy.ChatAdapter())
        return runtime.Runtime(settings=settings, lm=lm, judge_lm=lm, model_label="scripted")

    monkeypatch.setattr(runtime, "build_runtime", fake_build)
    monkeypatch.setenv("NEMORI_CACHE_DIR", str(cache_dir))
    return lm
