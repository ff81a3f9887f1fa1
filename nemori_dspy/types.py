"""Typed records of the memory: messages, episodes, semantic entries and query results.

Shapes follow the paper's data model (§3.2): a message is (speaker r, content c,
timestamp τ); an episode is (cue c, narrative N, raw messages P, vector v); a
semantic entry is (text k, vector u). Ids, user ids, time spans and lineage are
what a real store needs on top.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone, tzinfo
from functools import lru_cache
from typing import Any, Iterable, Literal, Mapping, Union
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil import parser as date_parser
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator,
                      model_validator)

from .errors import InvalidInputError

__all__ = [
    "Message",
    "StoredMessage",
    "Episode",
    "SemanticEntry",
    "SemanticVersion",
    "RETIRE_DECISIONS",
    "ScoredEpisode",
    "ScoredSemantic",
    "SearchResult",
    "AnswerResult",
    "MemoryStatus",
    "ForgetResult",
    "DeleteMessageResult",
    "Usage",
    "MetadataValue",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_VALUE_CHARS",
    "check_metadata",
    "metadata_matches",
    "parse_timestamp",
    "utcnow",
    "instant",
    "zone",
    "span_union",
]


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


@lru_cache(maxsize=64)
def zone(name: str) -> tzinfo:
    """The time zone an IANA name such as ``"Europe/Berlin"`` or ``"UTC"`` denotes.

    Raises:
        InvalidInputError: the name is not a known zone (field ``naive_timezone``).
    """
    if name.strip().upper() in ("UTC", "Z"):
        return timezone.utc
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInputError("naive_timezone", f"{name!r} is not a known time zone",
                                "use an IANA name such as 'UTC', 'Europe/Berlin' or 'Asia/Shanghai'") from exc


def instant(ts: datetime, naive_timezone: str = "UTC") -> datetime:
    """The moment ``ts`` denotes, as an aware UTC datetime: the one key for ordering and gap arithmetic.

    A naive ``ts`` is read as clock time in ``naive_timezone`` (the ``naive_timezone`` setting); an aware
    one keeps its offset. Messages keep their own timestamps for display; only comparisons use this, so
    naive and offset-carrying timestamps of one user can be sorted and subtracted together.

    Raises:
        InvalidInputError: ``naive_timezone`` is not a known zone.
    """
    if ts.tzinfo is None or ts.tzinfo.utcoffset(ts) is None:
        ts = ts.replace(tzinfo=zone(naive_timezone))
    return ts.astimezone(timezone.utc)


def span_union(spans: Iterable[tuple[datetime | None, datetime | None]],
               naive_timezone: str = "UTC") -> tuple[datetime | None, datetime | None]:
    """The smallest span covering all given ``(start, end)`` spans: (earliest start, latest end).

    Compared through ``instant`` (naive read in ``naive_timezone``); the winning timestamps are
    returned as given (naive stays naive). Spans with a None bound are skipped; none left → (None, None).
    """
    known = [(s, e) for s, e in spans if s is not None and e is not None]
    if not known:
        return None, None
    start = min((s for s, _ in known), key=lambda t: instant(t, naive_timezone))
    end = max((e for _, e in known), key=lambda t: instant(t, naive_timezone))
    return start, end


def parse_timestamp(value: Any, field: str = "timestamp") -> datetime:
    """Parse a datetime, ISO string or LoCoMo-style date string ("1:56 pm on 8 May, 2023").

    Naive datetimes are kept naive (conversation-local time, as LoCoMo gives them); compare timestamps
    through ``instant``, which reads naive ones in the ``naive_timezone`` setting.

    Raises:
        InvalidInputError: the value is empty or cannot be parsed; names ``field``.
    """
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, f"expected a datetime or date string, got {value!r}",
                                "pass e.g. '2023-05-08T13:56:00' or '1:56 pm on 8 May, 2023'")
    text = value.strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    try:
        return datetime.strptime(text, "%I:%M %p on %d %B, %Y")
    except ValueError:
        pass
    try:
        return date_parser.parse(text)
    except (ValueError, OverflowError) as exc:
        raise InvalidInputError(field, f"cannot parse {value!r} as a date-time",
                                "use ISO 8601, e.g. '2023-05-08T13:56:00'") from exc


#: A metadata value: a string, whole number, finite float or boolean (kept with its JSON type).
MetadataValue = Union[StrictBool, StrictInt, StrictFloat, StrictStr]
MAX_METADATA_KEYS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1024
_META_KEY = re.compile(r"^[^\x00-\x1f\x7f]{1,%d}$" % MAX_METADATA_KEY_CHARS)


def check_metadata(meta: Mapping[str, Any], field: str = "metadata") -> dict[str, Any]:
    """Validate a metadata mapping: at most 32 keys of 1-64 characters without control characters,
    values ``str`` (at most 1024 characters), ``int``, finite ``float`` or ``bool``.

    Returns:
        a plain ``dict`` copy.
    Raises:
        InvalidInputError: names ``field`` (and the key) and what is allowed.
    """
    fix = ("give a flat object of at most 32 keys (1-64 characters) whose values are strings "
           "(at most 1024 characters), numbers or booleans, e.g. {'session': 's1', 'turn': 3}")
    if not isinstance(meta, Mapping):
        raise InvalidInputError(field, f"expected an object, got {type(meta).__name__}", fix)
    if len(meta) > MAX_METADATA_KEYS:
        raise InvalidInputError(field, f"has {len(meta)} keys, more than {MAX_METADATA_KEYS}", fix)
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if not isinstance(k, str) or not _META_KEY.fullmatch(k):
            raise InvalidInputError(field, f"key {str(k)[:40]!r} is not 1-{MAX_METADATA_KEY_CHARS} characters "
                                    "without control characters", fix)
        if isinstance(v, bool) or isinstance(v, int):
            pass
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInputError(f"{field}.{k}", f"{v!r} is not a finite number", fix)
        elif isinstance(v, str):
            if len(v) > MAX_METADATA_VALUE_CHARS:
                raise InvalidInputError(f"{field}.{k}", f"is {len(v)} characters, more than "
                                        f"{MAX_METADATA_VALUE_CHARS}", fix)
        else:
            raise InvalidInputError(f"{field}.{k}", f"{type(v).__name__} is not a string, number or boolean", fix)
        out[k] = v
    return out


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps JSON types apart: ``True`` is not ``1``, ``"1"`` is not ``1``; ``1 == 1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def metadata_matches(meta: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """True if ``meta`` has every key of ``wanted`` with an equal value (JSON types kept apart)."""
    meta = meta or {}
    return all(k in meta and _same(meta[k], v) for k, v in wanted.items())


class Message(BaseModel):
    """One conversation message as a caller hands it to ``Memory.add_messages``.

    Fields: ``speaker`` (name or role), ``content`` (non-empty text), ``timestamp``
    (when it was said; datetime or parseable string; kept as given, compared through ``instant``),
    optional caller ``id``
    (e.g. LoCoMo's ``dia_id``) used for idempotent re-ingestion, optional ``metadata``
    (flat ``{str: str | int | float | bool}``, see ``check_metadata``): stored with the message,
    returned with its episode's messages and usable as a ``Memory.search`` filter; never shown to
    the LLM.
    """

    model_config = ConfigDict(extra="forbid")

    speaker: str = Field(min_length=1, description="who said it: a name or a role such as 'user'")
    content: str = Field(description="the message text; must not be blank")
    timestamp: datetime = Field(description="when it was said")
    id: str | None = Field(default=None, description="caller's message id, unique per user")
    metadata: dict[str, MetadataValue] = Field(default_factory=dict,
                                               description="caller's tags, e.g. {'session': 's1', 'channel': 'chat'}")

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_meta(cls, v: Any) -> Any:
        return {} if v is None else check_metadata(v)

    @field_validator("timestamp", mode="before")
    @classmethod
    def _parse_ts(cls, v: Any) -> datetime:
        # kept as given (its own clock time is what prompts show); ordering and gaps compare through
        # ``instant`` (naive read in ``naive_timezone``), so naive and offset-carrying times can mix
        return parse_timestamp(v)

    @field_validator("content")
    @classmethod
    def _non_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("content is blank; send only messages with text")
        return v


class StoredMessage(Message):
    """A message as persisted: adds the store's sequence number, user and episode assignment."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="message id (caller's, or a content hash when none was given)")
    user_id: str
    seq: int = Field(description="arrival order within the user, from 1")
    episode_id: str | None = Field(default=None, description="episode holding it; None while buffered")


class Episode(BaseModel):
    """A narrative episode (§3.2.2): cue, narrative, raw messages and embedding.

    ``vector`` is the embedding of ``cue + "\\n" + narrative`` (float32 list, dimension
    of the store's embedder). ``start``/``end`` span its messages' timestamps.
    ``supersedes`` lists ids of episodes merged into this one (§3.2.3).
    """

    id: str
    user_id: str
    cue: str
    narrative: str
    message_ids: list[str]
    messages: list[StoredMessage] = Field(default_factory=list)
    start: datetime
    end: datetime
    vector: list[float] = Field(default_factory=list, repr=False)
    supersedes: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)
    window: int = Field(default=0, description="index of the buffer window that produced it")
    distilled: bool = False


class SemanticEntry(BaseModel):
    """A semantic memory entry (§3.3): one self-contained statement plus its vector.

    Two clocks, kept apart: ``event_start``/``event_end`` span the source episodes' messages (when
    what the fact states happened or was said, in the conversation's own timestamps, naive or aware),
    ``created_at`` is when the entry was written (ingestion time, UTC). Prompts show only the event
    span; an entry without one (written before event times were kept) is shown undated, never with
    its ``created_at``. Giving one bound only sets the other to the same instant.
    """

    id: str
    user_id: str
    text: str
    vector: list[float] = Field(default_factory=list, repr=False)
    source_episode_ids: list[str] = Field(default_factory=list)
    supersedes: list[str] = Field(default_factory=list)
    event_start: datetime | None = Field(default=None, description="earliest message time of the source episodes")
    event_end: datetime | None = Field(default=None, description="latest message time of the source episodes")
    created_at: datetime = Field(default_factory=utcnow, description="when the entry was written (not event time)")
    origin: str | None = Field(default=None, description="the decision that made this version: 'new', 'merge', "
                               "'conflict' (P_con, §3.3.3) or 'user_update' (a user's correction); None for an "
                               "entry written before decisions were recorded. It is the decision that retires "
                               "the entries listed in ``supersedes``")

    @model_validator(mode="after")
    def _both_bounds(self) -> "SemanticEntry":
        if self.event_start is None:
            self.event_start = self.event_end
        elif self.event_end is None:
            self.event_end = self.event_start
        return self


#: The decisions that retire a semantic entry: P_con's merge (merged into the entry that replaces it) and conflict
#: (contradicted by it), and a user's correction (``Memory.update_semantic``); "superseded" when the store was not
#: told which (an entry retired without a replacement carrying its decision).
RETIRE_DECISIONS = ("merge", "conflict", "user_update", "superseded")


class SemanticVersion(SemanticEntry):
    """One version of a semantic entry as ``Memory.semantic_history`` lists it: the entry, live or retired, with
    what retired it. Retired versions are kept (never searched, never listed) so a fact's history can be read."""

    live: bool = Field(description="True for the current version (searched and listed), False once retired")
    retired_at: datetime | None = Field(default=None, description="when it was retired (UTC); None while live, or "
                                        "for a version retired before retirements were recorded")
    retired_by: str | None = Field(default=None, description="id of the version that replaced it")
    retired_decision: str | None = Field(default=None, description="the decision that retired it: one of "
                                         "``RETIRE_DECISIONS``; None while live or when not recorded")


class ScoredEpisode(BaseModel):
    """An episode with its score for a query: cosine similarity in [-1, 1], or for a search fused with
    the lexical match (``lexical_weight`` > 0) the fused score (at most 1)."""

    episode: Episode
    score: float


class ScoredSemantic(BaseModel):
    """A semantic entry with its score for a query: cosine similarity in [-1, 1], or for a search fused
    with the lexical match (``lexical_weight`` > 0) the fused score (at most 1)."""

    entry: SemanticEntry
    score: float


class SearchResult(BaseModel):
    """What ``Memory.search`` returns: top-k episodes and top-m semantic entries, best first."""

    episodes: list[ScoredEpisode] = Field(default_factory=list)
    semantic: list[ScoredSemantic] = Field(default_factory=list)


class Usage(BaseModel):
    """LLM usage: real calls, cache hits, input/output tokens, wall seconds, dollars (0 for local)."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float = 0.0

    def add(self, other: "Usage") -> "Usage":
        """Return the field-wise sum of two usages."""
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})


class AnswerResult(BaseModel):
    """What ``Memory.answer`` returns: the answer, the context it was given, and LLM usage."""

    question: str
    answer: str
    context: str
    retrieved: SearchResult
    usage: Usage
    mode: Literal["memory", "no-memory"] = "memory"


class MemoryStatus(BaseModel):
    """What ``Memory.status`` returns: one user's stored counts (from the store: they survive a restart), and
    this process's view of its health."""

    messages: int = Field(0, description="raw messages stored")
    pending: int = Field(0, description="buffered messages not yet in an episode")
    episodes: int = Field(0, description="live episodes")
    superseded_episodes: int = Field(0, description="episode versions replaced by a merge or a rewrite")
    semantic: int = Field(0, description="live semantic entries")
    to_distill: int = Field(0, description="live episodes whose semantic step has not been committed")
    known: bool = Field(False, description="anything stored for the user (an unknown user reads as all zeros)")
    parked: list[str] = Field(default_factory=list, description="reasons from this process's latest pass for the "
                              "user; empty after a restart or once the work succeeds")
    healthy: bool = Field(True, description="nothing parked and nothing left to distill")
    counters: dict[str, int] = Field(default_factory=dict, description="retries, parked windows... of this Memory "
                                     "since it was made (all users: ``Memory.usage.counters``)")


class ForgetResult(BaseModel):
    """What ``Memory.forget`` returns: the ids removed everywhere a fact was held, and those re-buffered."""

    semantic: list[str] = Field(default_factory=list, description="semantic entries deleted (the one asked for "
                                "and those distilled only from the removed episodes)")
    episodes: list[str] = Field(default_factory=list, description="episodes deleted, live and superseded versions")
    messages: list[str] = Field(default_factory=list, description="raw messages deleted (the entry's sources')")
    requeued: list[str] = Field(default_factory=list, description="other messages of the deleted episodes, back in "
                                "the buffer to be re-formed into episodes")


class DeleteMessageResult(BaseModel):
    """What ``Memory.delete_message`` returns: the ids derived from the message that went with it, and
    the ids re-buffered."""

    episodes: list[str] = Field(default_factory=list, description="episodes deleted: the one holding the message "
                                "and its superseded versions that held it")
    semantic: list[str] = Field(default_factory=list, description="semantic entries deleted: those whose every "
                                "source episode was deleted")
    requeued: list[str] = Field(default_factory=list, description="the deleted episode's other messages, back in "
                                "the buffer to be re-formed into episodes")
