"""LoCoMo loader: turns ``locomo10.json`` samples into typed conversations and questions.

Schema and quirks follow ``shared/data/locomo/README.md`` (upstream snap-research/locomo
``data/locomo10.json``): sessions come from ``session_N`` keys (not the date keys), every
turn takes its session's ``session_N_date_time``, image turns carry a ``blip_caption``,
category-5 items often have no ``answer``, a few answers are ints and a few evidence
strings are malformed.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from nemori_dspy.errors import DatasetError
from nemori_dspy.eval.dataset_io import read_json_list
from nemori_dspy.types import Message, parse_timestamp

__all__ = [
    "CATEGORY_NAMES",
    "SCORED_CATEGORIES",
    "LoCoMoQuestion",
    "LoCoMoConversation",
    "load_locomo",
    "normalise_evidence",
    "dataset_sha256",
    "SessionSlice",
    "parse_sessions",
    "slice_sessions",
    "session_of",
    "NAMED_SLICES",
    "named_slice",
    "stratified_questions",
    "LoCoMoObservation",
]

CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
"""LoCoMo category code → name (mapping verified against counts in the data README)."""

SCORED_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
"""Categories mem0 and Nemori score (category 5, adversarial, is excluded)."""

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"^D(\d+):(\d+)$")


class LoCoMoQuestion(BaseModel):
    """One QA item of a LoCoMo sample.

    ``index`` is the item's position in the sample's ``qa`` list. ``answer`` is the gold
    answer as a stripped string (ints go through ``str()``; ``""`` when the key is missing,
    as for most category-5 items). ``evidence`` holds normalised ``D<session>:<turn>`` ids;
    ``raw_evidence`` keeps the strings exactly as the file gives them. ``adversarial_answer`` is the
    file's plausible but wrong answer (category-5 items carry one; None when absent or blank); the
    judge audit (``eval/judge_audit.py``) uses it as a known-wrong prediction.
    """

    sample_id: str
    index: int
    question: str
    answer: str = ""
    category: int
    evidence: list[str] = Field(default_factory=list)
    raw_evidence: list[str] = Field(default_factory=list)
    adversarial_answer: str | None = None

    @property
    def category_name(self) -> str:
        """Human name of ``category`` (e.g. ``"multi-hop"``)."""
        return CATEGORY_NAMES.get(self.category, str(self.category))


class LoCoMoObservation(BaseModel):
    """One gold observation of a LoCoMo sample (``observation.session_<N>_observation[speaker]``, written by
    gpt-3.5 for the dataset): a fact about ``speaker`` stated in session ``session``, with the normalised
    ``D<session>:<turn>`` ids of the turns it rests on (the file's dia_id, sometimes a list; ids that do not
    parse are dropped, so ``dia_ids`` may be empty)."""

    session: int
    speaker: str
    text: str
    dia_ids: list[str] = Field(default_factory=list)


class LoCoMoConversation(BaseModel):
    """One LoCoMo sample: two speakers, their messages in order, and the QA items; ``observations`` and
    ``session_summaries`` (session number → the file's generated summary) are the dataset's annotations
    (empty when the file has none), read by the memory-quality metrics (``eval.memory_quality``)."""

    sample_id: str
    speaker_a: str
    speaker_b: str
    messages: list[Message]
    questions: list[LoCoMoQuestion]
    observations: list[LoCoMoObservation] = Field(default_factory=list)
    session_summaries: dict[int, str] = Field(default_factory=dict)


def normalise_evidence(raw: list[Any]) -> list[str]:
    """Normalise a raw ``evidence`` list into well-formed ``D<n>:<m>`` ids.

    Strings are split on ``;`` and whitespace ("D8:6; D9:17", "D9:1 D4:4 D4:6"); pieces
    that do not match ``D<digits>:<digits>`` ("D", "D:11:26") are dropped; leading zeros
    are removed ("D30:05" → "D30:5"). Order is kept, duplicates removed.
    """
    out: list[str] = []
    for item in raw or []:
        for piece in re.split(r"[;\s]+", str(item)):
            match = _DIA_ID.match(piece.strip())
            if match:
                dia = f"D{int(match.group(1))}:{int(match.group(2))}"
                if dia not in out:
                    out.append(dia)
    return out


def dataset_sha256(path: str | Path) -> str:
    """Hex sha256 of the file at ``path`` (64 lowercase hex chars).

    Raises:
        DatasetError: the file does not exist.
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetError(f"{file}: file not found. Fix: pass the path of locomo10.json (--data).")
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_locomo(path: str | Path, sample_ids: list[str] | None = None) -> list[LoCoMoConversation]:
    """Load LoCoMo samples from ``path`` (``locomo10.json`` or a same-schema subset).

    Args:
        path: the JSON file (a list of samples).
        sample_ids: keep only these samples, in this order; ``None`` keeps all in file order.

    Returns:
        One ``LoCoMoConversation`` per sample. Messages are in session order (sessions
        sorted by N), each stamped with its session's date-time (naive, conversation-local);
        ``id`` is the turn's ``dia_id``; image turns get `` [shares an image: <caption>]``.

    Raises:
        DatasetError: the file is missing, is not valid JSON, is not a list of samples,
            a sample lacks ``conversation``/``qa``, or a requested sample id is unknown.
    """
    file = Path(path)
    samples = _read_samples(file)
    by_id = {str(s.get("sample_id", f"#{i}")): s for i, s in enumerate(samples)}
    if sample_ids is None:
        chosen = list(by_id.items())
    else:
        unknown = [sid for sid in sample_ids if sid not in by_id]
        if unknown:
            raise DatasetError(
                f"{file}: unknown sample id(s) {unknown}. Available: {sorted(by_id)}. "
                "Fix: pass ids from that list."
            )
        chosen = [(sid, by_id[sid]) for sid in sample_ids]
    return [_parse_sample(file, sid, sample) for sid, sample in chosen]


def _read_samples(file: Path) -> list[dict[str, Any]]:
    return read_json_list(
        file,
        missing_fix="download data/locomo10.json from https://github.com/snap-research/locomo and pass its path "
                    "(--data or NEMORI_LOCOMO_PATH).",
        schema_fix="use the unmodified locomo10.json (a list of 10 samples) or a subset with the same schema.",
        item="sample")


def _parse_sample(file: Path, sample_id: str, sample: dict[str, Any]) -> LoCoMoConversation:
    for key in ("conversation", "qa"):
        if key not in sample:
            raise DatasetError(
                f"{file}: sample {sample_id!r} has no {key!r} key. Fix: use the unmodified "
                "locomo10.json schema (each sample needs 'conversation' and 'qa')."
            )
    conv = sample["conversation"]
    return LoCoMoConversation(
        sample_id=sample_id,
        speaker_a=str(conv.get("speaker_a", "")),
        speaker_b=str(conv.get("speaker_b", "")),
        messages=_parse_messages(file, sample_id, conv),
        questions=[_parse_question(sample_id, i, q) for i, q in enumerate(sample["qa"])],
        observations=_parse_observations(sample.get("observation")),
        session_summaries=_parse_summaries(sample.get("session_summary")),
    )


_ANNOTATION_KEY = re.compile(r"^session_(\d+)_(?:observation|summary)$")


def _parse_observations(raw: Any) -> list[LoCoMoObservation]:
    """``observation`` → one ``LoCoMoObservation`` per [text, dia_id] item, sessions in order (absent → [])."""
    out: list[LoCoMoObservation] = []
    if not isinstance(raw, dict):
        return out
    for key in sorted(raw, key=lambda k: int(m.group(1)) if (m := _ANNOTATION_KEY.match(k)) else 0):
        m = _ANNOTATION_KEY.match(key)
        if not m or not isinstance(raw[key], dict):
            continue
        for speaker, items in raw[key].items():
            for item in items or []:
                if isinstance(item, (list, tuple)) and item and str(item[0]).strip():
                    dia = item[1] if len(item) > 1 else []
                    out.append(LoCoMoObservation(session=int(m.group(1)), speaker=str(speaker),
                                                 text=str(item[0]).strip(),
                                                 dia_ids=normalise_evidence(dia if isinstance(dia, list) else [dia])))
    return out


def _parse_summaries(raw: Any) -> dict[int, str]:
    """``session_summary`` → {session number: summary text} (absent → {})."""
    if not isinstance(raw, dict):
        return {}
    return {int(m.group(1)): str(v) for k, v in raw.items() if (m := _ANNOTATION_KEY.match(k)) and v}


def _session_numbers(conv: dict[str, Any]) -> list[int]:
    return sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))


def _parse_messages(file: Path, sample_id: str, conv: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    for n in _session_numbers(conv):
        date_key = f"session_{n}_date_time"
        if date_key not in conv:
            raise DatasetError(
                f"{file}: sample {sample_id!r} has session_{n} but no {date_key!r}. "
                "Fix: use the unmodified locomo10.json."
            )
        when = parse_timestamp(conv[date_key], field=f"{sample_id}.{date_key}")
        messages.extend(_turn_message(turn, when) for turn in conv[f"session_{n}"])
    return messages


def _turn_message(turn: dict[str, Any], when: Any) -> Message:
    content = str(turn.get("text", ""))
    caption = turn.get("blip_caption")
    if caption:
        content = f"{content} [shares an image: {caption}]"
    return Message(speaker=turn["speaker"], content=content, timestamp=when, id=turn.get("dia_id"))


def _parse_question(sample_id: str, index: int, item: dict[str, Any]) -> LoCoMoQuestion:
    answer, adversarial = item.get("answer"), item.get("adversarial_answer")
    raw = [str(e) for e in item.get("evidence") or []]
    return LoCoMoQuestion(
        sample_id=sample_id,
        index=index,
        question=str(item.get("question", "")),
        answer="" if answer is None else str(answer).strip(),
        category=int(item["category"]),
        evidence=normalise_evidence(raw),
        raw_evidence=raw,
        adversarial_answer=(str(adversarial).strip() or None) if adversarial is not None else None,
    )


class SessionSlice(BaseModel):
    """Sessions ``first..last`` (1-based, inclusive) of every conversation: a LoCoMo *slice*.

    Tuning loops run on slices because building memory of a whole conversation costs hours with a
    small local model (e.g. ``1-3``: 669 turns and 169 scored questions over all of ``locomo10.json``).
    """

    first: int = Field(ge=1)
    last: int = Field(ge=1)

    def label(self) -> str:
        """``"1-3"`` (the form ``parse_sessions`` reads)."""
        return f"{self.first}-{self.last}"

    def __contains__(self, session: int) -> bool:
        return self.first <= session <= self.last


def parse_sessions(text: str | None) -> SessionSlice | None:
    """``"1-3"`` → ``SessionSlice(first=1, last=3)``; ``"2"`` → sessions 2..2; None/"" → None (all sessions).

    Raises:
        DatasetError: not ``A`` or ``A-B`` with 1 ≤ A ≤ B.
    """
    if text is None or not str(text).strip():
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", str(text))
    if not m or int(m.group(1)) < 1 or int(m.group(2) or m.group(1)) < int(m.group(1)):
        raise DatasetError(f"--sessions {text!r}: expected A-B with 1 <= A <= B (e.g. 1-3) or one number. "
                           "Fix: pass e.g. --sessions 1-3.")
    return SessionSlice(first=int(m.group(1)), last=int(m.group(2) or m.group(1)))


def session_of(dia_id: str | None) -> int | None:
    """Session number of a ``D<session>:<turn>`` id (``"D3:7"`` → 3); None for other ids."""
    m = _DIA_ID.match(dia_id or "")
    return int(m.group(1)) if m else None


def slice_sessions(conv: LoCoMoConversation, sessions: SessionSlice | None) -> LoCoMoConversation:
    """The conversation cut to ``sessions``: only their turns, and only the questions whose evidence
    lies entirely inside them (questions without evidence are dropped too: nothing places them).

    ``sessions=None`` returns ``conv`` unchanged. Question ``index`` values are kept (they identify
    the item in the full file).
    """
    if sessions is None:
        return conv
    msgs = [m for m in conv.messages if session_of(m.id) in sessions]
    qs = [q for q in conv.questions if q.evidence and all(session_of(e) in sessions for e in q.evidence)]
    return conv.model_copy(update={"messages": msgs, "questions": qs})


def stratified_questions(questions: list[LoCoMoQuestion], max_questions: int | None) -> list[LoCoMoQuestion]:
    """At most ``max_questions`` of ``questions``, stratified by category (deterministic, no randomness).

    Slots are dealt round-robin over the categories present (in ascending category code), each category
    giving its questions in their given order; a category that runs out is skipped, so its unused share goes
    to the categories with questions left. Each of k categories thus gets ``max_questions // k`` or one more
    (fewer only if it has fewer). The chosen questions come back in their original order.

    ``max_questions=None`` (or not smaller than the list) returns every question; 0 returns none.

    Raises:
        ValueError: ``max_questions`` is negative.
    """
    if max_questions is None or max_questions >= len(questions):
        return list(questions)
    if max_questions < 0:
        raise ValueError(f"max_questions must be >= 0 or None, got {max_questions}")
    queues: dict[int, list[int]] = {}
    for pos, q in enumerate(questions):
        queues.setdefault(q.category, []).append(pos)
    order = [queues[c][::-1] for c in sorted(queues)]  # reversed: pop() takes the earliest question
    chosen: list[int] = []
    while len(chosen) < max_questions:
        for queue in order:
            if queue and len(chosen) < max_questions:
                chosen.append(queue.pop())
    return [questions[pos] for pos in sorted(chosen)]


#: Named LoCoMo slices (``--slice NAME``): name → (conversation ids, sessions or None = all, what it is for).
#: ``memory``: conv-49 (Evan/Sam), all sessions: 509 turns in 25 sessions, so even at one episode per session it
#: holds >= 25 episodes and top-10 retrieval must choose; 156 scored questions (multi-hop 37, temporal 33,
#: open-domain 13, single-hop 73), 45 of them with evidence in two or more sessions (facts that recur or change
#: between sessions). The smallest LoCoMo conversation with >= 25 sessions (the other seven have 28-32 sessions
#: and 568-689 turns); its build time is estimated in docs/decisions.md.
NAMED_SLICES: dict[str, tuple[tuple[str, ...], SessionSlice | None, str]] = {
    "memory": (("conv-49",), None,
               "conv-49, all sessions: 509 turns, 25 sessions (top-10 must choose among >= 25 episodes), "
               "156 scored questions in all four categories"),
}


def named_slice(name: str) -> tuple[list[str], SessionSlice | None]:
    """(conversation ids, sessions or None for all) of the named slice ``name`` (``NAMED_SLICES``).

    Raises:
        DatasetError: ``name`` is not a named slice (the message lists them).
    """
    key = str(name).strip().lower()
    if key not in NAMED_SLICES:
        raise DatasetError(f"--slice {name!r}: unknown slice. Fix: use one of {', '.join(NAMED_SLICES)}.")
    ids, sessions, _ = NAMED_SLICES[key]
    return list(ids), sessions
