"""LongMemEval loader: turns the official JSON (``longmemeval_s_cleaned.json`` and same-schema
files) into typed questions, one memory (user) per question.

Schema and quirks follow ``shared/data/longmemeval/README.md`` (upstream
xiaowu0162/LongMemEval, HF ``xiaowu0162/longmemeval-cleaned``): the file is a list of question
dicts; each carries its own haystack (``haystack_session_ids`` / ``haystack_dates`` /
``haystack_sessions``, parallel lists), so every question gets a fresh memory whose user id is
the ``question_id``. Sessions are lists of ``{"role", "content"}`` turns; evidence turns carry
``"has_answer": true``. Dates look like ``"2023/05/30 (Tue) 23:40"``. A ``question_id`` ending
in ``_abs`` marks an abstention question. Some answers are ints. S and M sort sessions by
time; oracle does not, so the loader sorts sessions by date (stable: a no-op for S and M).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from nemori_dspy.errors import DatasetError, InvalidInputError
from nemori_dspy.eval.dataset_io import read_json_list
from nemori_dspy.types import Message, parse_timestamp

__all__ = [
    "QUESTION_TYPES",
    "ABSTENTION_SUFFIX",
    "LongMemEvalQuestion",
    "load_longmemeval",
    "parse_longmemeval_date",
    "turn_id",
]

QUESTION_TYPES: tuple[str, ...] = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
)
"""The six LongMemEval question types (abstention is a flag on top of them, not a type)."""

ABSTENTION_SUFFIX = "_abs"
"""A ``question_id`` ending in this marks an abstention (unanswerable) question."""

_REQUIRED_KEYS: tuple[str, ...] = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
    "answer_session_ids",
)
_WEEKDAY = re.compile(r"\s*\([A-Za-z]{3,9}\)\s*")


class LongMemEvalQuestion(BaseModel):
    """One LongMemEval question with its own haystack, ready to ingest as one memory.

    ``answer`` is the gold answer as a stripped string (ints go through ``str()``); for
    abstention questions it is the upstream explanation of why the question is unanswerable,
    for ``single-session-preference`` it is the rubric. ``messages`` are all haystack turns in
    session order (sessions sorted by date, stable), each stamped with its session's date;
    message ids are ``"<session_id>:<n>"`` with ``n`` the 1-based turn position in its
    session (upstream numbers turns from 1 too); ``speaker`` is the turn's role
    (``"user"``/``"assistant"``). ``evidence`` lists the ids of ``has_answer`` turns.
    """

    question_id: str
    question_type: str
    question: str
    answer: str
    question_date: datetime
    answer_session_ids: list[str] = Field(default_factory=list)
    haystack_session_ids: list[str] = Field(default_factory=list, description="session ids, in message order")
    messages: list[Message] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list, description="ids of turns marked has_answer")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_abstention(self) -> bool:
        """True when ``question_id`` ends in ``_abs`` (the judge then checks for "cannot answer")."""
        return self.question_id.endswith(ABSTENTION_SUFFIX)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def user_id(self) -> str:
        """The memory's user id: the ``question_id`` (one memory per question)."""
        return self.question_id


def turn_id(session_id: str, turn_index: int) -> str:
    """Message id of turn ``turn_index`` (0-based list position) of ``session_id``: ``"<sid>:<index+1>"``."""
    return f"{session_id}:{turn_index + 1}"


def parse_longmemeval_date(value: Any, field: str = "date") -> datetime:
    """Parse a LongMemEval date ``"2023/05/30 (Tue) 23:40"`` into a naive datetime.

    Falls back to ``nemori_dspy.types.parse_timestamp`` (ISO and other formats) after
    dropping the ``(Tue)`` weekday.

    Raises:
        InvalidInputError: the value cannot be parsed; names ``field``.
    """
    if isinstance(value, datetime):
        return value
    text = str(value).strip() if isinstance(value, str) else value
    if isinstance(text, str):
        try:
            return datetime.strptime(text, "%Y/%m/%d (%a) %H:%M")
        except ValueError:
            text = _WEEKDAY.sub(" ", text).strip()
    return parse_timestamp(text, field=field)


def load_longmemeval(
    path: str | Path,
    question_ids: list[str] | None = None,
    question_types: list[str] | tuple[str, ...] | None = None,
) -> list[LongMemEvalQuestion]:
    """Load LongMemEval questions from ``path`` (official S, M or oracle JSON, or a same-schema subset).

    Args:
        path: the JSON file (a list of question objects).
        question_ids: keep only these questions, in this order; ``None`` keeps all in file order.
        question_types: keep only questions of these types (applied after ``question_ids``).

    Returns:
        One ``LongMemEvalQuestion`` per kept question (see its docstring for the message layout).

    Raises:
        DatasetError: the file is missing, is not valid JSON, is not a list of objects, a
            question lacks a required key or has mismatched haystack lists or unparseable
            dates, or a requested question id or type is unknown.
    """
    file = Path(path)
    items = _read_items(file)
    by_id: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(items):
        qid = str(item.get("question_id", f"#{i}"))
        by_id.setdefault(qid, item)
    if question_types is not None:
        bad = [t for t in question_types if t not in QUESTION_TYPES]
        if bad:
            raise DatasetError(
                f"{file}: unknown question type(s) {bad}. Known: {list(QUESTION_TYPES)}. "
                "Fix: pass types from that list (abstention is not a type; filter on is_abstention)."
            )
    if question_ids is None:
        chosen = list(by_id.items())
    else:
        unknown = [qid for qid in question_ids if qid not in by_id]
        if unknown:
            shown = sorted(by_id)
            more = f" (and {len(shown) - 20} more)" if len(shown) > 20 else ""
            raise DatasetError(
                f"{file}: unknown question id(s) {unknown}. Available: {shown[:20]}{more}. "
                "Fix: pass ids from the file's question_id values."
            )
        chosen = [(qid, by_id[qid]) for qid in question_ids]
    out = [_parse_question(file, qid, item) for qid, item in chosen]
    if question_types is not None:
        wanted = set(question_types)
        out = [q for q in out if q.question_type in wanted]
    return out


def _read_items(file: Path) -> list[dict[str, Any]]:
    return read_json_list(
        file,
        missing_fix="download longmemeval_s_cleaned.json from https://huggingface.co/datasets/xiaowu0162/"
                    "longmemeval-cleaned and pass its path (see shared/data/longmemeval/README.md).",
        schema_fix="use the official longmemeval_s_cleaned.json (a JSON list of 500 questions, not JSONL) or a "
                   "subset with the same schema; re-formatted copies (e.g. {'questions': [...]}) are not supported.",
        item="question")


def _parse_question(file: Path, qid: str, item: dict[str, Any]) -> LongMemEvalQuestion:
    missing = [k for k in _REQUIRED_KEYS if k not in item]
    if missing:
        raise DatasetError(
            f"{file}: question {qid!r} has no {', '.join(repr(k) for k in missing)} key(s). Fix: use the "
            f"official LongMemEval schema (each question needs {list(_REQUIRED_KEYS)})."
        )
    qtype = str(item["question_type"])
    if qtype not in QUESTION_TYPES:
        raise DatasetError(
            f"{file}: question {qid!r} has unknown question_type {qtype!r}. Known: {list(QUESTION_TYPES)}. "
            "Fix: use the official LongMemEval file."
        )
    sids, dates, sessions = item["haystack_session_ids"], item["haystack_dates"], item["haystack_sessions"]
    if not (isinstance(sids, list) and isinstance(dates, list) and isinstance(sessions, list)) or not (
        len(sids) == len(dates) == len(sessions)
    ):
        raise DatasetError(
            f"{file}: question {qid!r}: haystack_session_ids, haystack_dates and haystack_sessions must be "
            f"lists of equal length (got {_len(sids)}, {_len(dates)}, {_len(sessions)}). "
            "Fix: use the unmodified LongMemEval file."
        )
    question_date = _date(file, qid, item["question_date"], "question_date")
    stamped = [
        (_date(file, qid, d, f"haystack_dates[{i}]"), i, str(sid), sess)
        for i, (sid, d, sess) in enumerate(zip(sids, dates, sessions))
    ]
    stamped.sort(key=lambda s: (s[0], s[1]))  # by date, stable: oracle files are not sorted
    messages: list[Message] = []
    evidence: list[str] = []
    seen: dict[str, int] = {}
    order: list[str] = []
    for when, i, sid, session in stamped:
        if not isinstance(session, list):
            raise DatasetError(
                f"{file}: question {qid!r}: haystack_sessions[{i}] is not a list of turns. "
                "Fix: use the unmodified LongMemEval file."
            )
        seen[sid] = seen.get(sid, 0) + 1
        key = sid if seen[sid] == 1 else f"{sid}#{seen[sid]}"  # keep message ids unique per memory
        order.append(key)
        for t, turn in enumerate(session):
            if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                raise DatasetError(
                    f"{file}: question {qid!r}: session {sid!r} turn {t} lacks 'role'/'content'. "
                    "Fix: use the unmodified LongMemEval file."
                )
            mid = turn_id(key, t)
            if turn.get("has_answer") is True:
                evidence.append(mid)
            content = "" if turn["content"] is None else str(turn["content"])
            if not content.strip():
                continue  # Message rejects blank content; the id numbering keeps file positions
            messages.append(Message(speaker=str(turn["role"]), content=content, timestamp=when, id=mid))
    answer = item["answer"]
    return LongMemEvalQuestion(
        question_id=qid,
        question_type=qtype,
        question=str(item["question"]),
        answer="" if answer is None else str(answer).strip(),
        question_date=question_date,
        answer_session_ids=[str(s) for s in item["answer_session_ids"] or []],
        haystack_session_ids=order,
        messages=messages,
        evidence=evidence,
    )


def _len(value: Any) -> Any:
    return len(value) if isinstance(value, list) else type(value).__name__


def _date(file: Path, qid: str, value: Any, field: str) -> datetime:
    try:
        return parse_longmemeval_date(value, field=f"{qid}.{field}")
    except InvalidInputError as exc:
        raise DatasetError(
            f"{file}: question {qid!r}: cannot parse {field} {value!r} ({exc.problem}). "
            "Fix: dates must look like '2023/05/30 (Tue) 23:40' as in the official file."
        ) from exc
