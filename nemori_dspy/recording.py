"""Stage records: what each construction stage saw and returned while memory was built.

Tuning a construction stage (``nemori-dspy optimize --stage narrate``) needs that stage's real inputs —
exactly the text the pipeline sent it — without rebuilding memory per trial. While ``recording(path)`` is
active, every successful ``StagePredict`` call appends one JSON line to ``path``::

    {"stage": "narrate", "inputs": {"messages": "..."}, "outputs": {"cue": "...", "narrative": "..."},
     "meta": {"user_id": "conv-26", "window": 0, "message_ids": ["D1:1", ...]}}

``meta`` comes from ``stage_meta(...)`` blocks opened by the pipeline (user, window, episode and message
ids), so examples can be joined with LoCoMo's QA evidence. The file sits beside the memory it describes
(``<store>.stages.jsonl``). A crash and replay may record a call twice; ``read_records`` keeps the last
record per (stage, user, inputs).
"""

from __future__ import annotations

import contextvars
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, Field

__all__ = ["StageRecord", "StageRecorder", "recording", "stage_meta", "current_recorder", "read_records"]

_RECORDER: contextvars.ContextVar["StageRecorder | None"] = contextvars.ContextVar("nemori_recorder", default=None)
_META: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("nemori_stage_meta", default={})


class StageRecord(BaseModel):
    """One stage call: ``stage`` name, its ``inputs`` and parsed ``outputs`` (field → value), and ``meta``."""

    stage: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    meta: dict[str, Any] = Field(default_factory=dict)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class StageRecorder:
    """Appends ``StageRecord`` lines to ``path`` (thread-safe; each line flushed as written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def record(self, stage: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Append one call, with the ``stage_meta`` active in the calling context."""
        rec = StageRecord(stage=stage, inputs=_jsonable(inputs), outputs=_jsonable(outputs),
                          meta=_jsonable(_META.get()))
        line = rec.model_dump_json() + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


@contextmanager
def recording(path: str | Path | None) -> Iterator[StageRecorder | None]:
    """Record every stage call made in this block (this thread/task and contexts copied from it) to ``path``.

    ``path=None`` records nothing (a no-op block).
    """
    recorder = StageRecorder(path) if path is not None else None
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


def current_recorder() -> StageRecorder | None:
    """The recorder active in this context, or None."""
    return _RECORDER.get()


@contextmanager
def stage_meta(**meta: Any) -> Iterator[None]:
    """Attach ``meta`` (merged over any outer block's) to the records of the calls made in this block."""
    token = _META.set({**_META.get(), **meta})
    try:
        yield
    finally:
        _META.reset(token)


def read_records(path: str | Path, stage: str | None = None) -> list[StageRecord]:
    """Records in ``path`` (file order), optionally of one ``stage``; a missing file gives [].

    A record repeated by a crash/replay (same stage, user and inputs) is kept once, at its last position.
    Lines that do not parse (a write cut by a kill) are skipped.
    """
    file = Path(path)
    if not file.exists():
        return []
    out: dict[str, StageRecord] = {}
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            rec = StageRecord.model_validate_json(line)
        except ValueError:
            continue
        if stage is not None and rec.stage != stage:
            continue
        key = json.dumps([rec.stage, rec.meta.get("user_id"), rec.inputs], sort_keys=True)
        out.pop(key, None)
        out[key] = rec
    return list(out.values())
