"""Rendering of memory records into the text fields signatures take (data layout, no instructions)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Sequence

from .temporal import annotate_relative_dates
from .types import Episode, SearchResult, SemanticEntry, StoredMessage

__all__ = ["MIN_MESSAGE_CHARS", "render_messages", "render_numbered_messages", "render_episode", "render_candidates",
           "render_entries", "render_fact", "strip_fact_date", "render_context", "date_span", "clip",
           "per_message_chars"]


def clip(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` characters, marking the cut with ``…[truncated N chars]``."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f" …[truncated {len(text) - max_chars} chars]"


#: a message is never clipped below this many characters, however many messages share a prompt's budget:
#: about two sentences, enough to keep who did what and when. The floor wins over the budget, so a prompt of
#: very many messages may exceed ``max_prompt_chars`` (a window of w = 20 at the floor is 4,000 characters).
MIN_MESSAGE_CHARS = 200


def per_message_chars(n: int, max_chars: int, budget: int | None) -> int:
    """Characters each of ``n`` messages may use: ``max_chars``, shrunk so n of them fit ``budget``, but
    never below ``MIN_MESSAGE_CHARS``."""
    if budget is None or n == 0:
        return max_chars
    return max(MIN_MESSAGE_CHARS, min(max_chars, budget // n))


def render_messages(messages: Sequence[StoredMessage], max_chars: int = 4000, budget: int | None = None,
                    resolve_dates: bool = False) -> str:
    """One line per message: ``[YYYY-MM-DD HH:MM] speaker: content``; each content clipped so that a
    message has at most ``max_chars`` and all of them together about ``budget`` characters. With
    ``resolve_dates``, relative expressions get their absolute date appended (``temporal.py``)."""
    cap = per_message_chars(len(messages), max_chars, budget)

    def content(m: StoredMessage) -> str:
        text = clip(m.content, cap)
        return annotate_relative_dates(text, m.timestamp) if resolve_dates else text

    return "\n".join(f"[{m.timestamp:%Y-%m-%d %H:%M}] {m.speaker}: {content(m)}" for m in messages)


def render_numbered_messages(messages: Sequence[StoredMessage], max_chars: int = 4000,
                             budget: int | None = None) -> str:
    """Like ``render_messages`` with 1-based numbers: ``3. [2023-05-08 13:56] Caroline: ...``."""
    cap = per_message_chars(len(messages), max_chars, budget)
    return "\n".join(f"{i}. [{m.timestamp:%Y-%m-%d %H:%M}] {m.speaker}: {clip(m.content, cap)}"
                     for i, m in enumerate(messages, 1))


def date_span(start: datetime, end: datetime) -> str:
    """``YYYY-MM-DD`` of ``start``, or ``YYYY-MM-DD to YYYY-MM-DD`` when ``end`` falls on another day
    (each in its own clock time, as messages are shown)."""
    s, e = f"{start:%Y-%m-%d}", f"{end:%Y-%m-%d}"
    return s if s == e else f"{s} to {e}"


def render_episode(ep: Episode) -> str:
    """``(date span) cue: narrative`` of one episode."""
    return f"({date_span(ep.start, ep.end)}) {ep.cue}: {ep.narrative}"


def render_fact(entry: SemanticEntry) -> str:
    """``(event date span) text`` of a semantic entry, e.g. ``(2023-05-08) Caroline adopted a dog.``;
    just ``text`` when the entry has no event time. Its ``created_at`` (ingestion time) is never shown."""
    if entry.event_start is None or entry.event_end is None:
        return entry.text
    return f"({date_span(entry.event_start, entry.event_end)}) {entry.text}"


def render_candidates(eps: Sequence[Episode]) -> str:
    """Numbered candidates ``[k] (span) cue: narrative``, k from 1."""
    return "\n".join(f"[{k}] {render_episode(ep)}" for k, ep in enumerate(eps, 1))


_FACT_DATE = re.compile(r"^\s*\(\d{4}-\d{2}-\d{2}(?: to \d{4}-\d{2}-\d{2})?\)\s*")


def strip_fact_date(text: str) -> str:
    """``text`` without a leading ``render_fact`` date prefix: ``"(2023-05-08) Bob ..."`` → ``"Bob ..."``."""
    return _FACT_DATE.sub("", text, count=1)


def render_entries(texts: Sequence[str]) -> str:
    """Numbered entries ``[i] text`` from 1, or ``(none)``; pass ``render_fact`` texts to show event dates."""
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts, 1)) or "(none)"


def render_context(result: SearchResult, raw_top_r: int, max_chars: int = 4000, budget: int | None = None,
                   resolve_dates: bool = False) -> str:
    """Answer context (§3.4): narratives of the top-k episodes, raw messages of the top-r, semantic facts,
    clipped to ``budget`` characters in all. Returns "" when nothing was retrieved. ``resolve_dates`` as
    in ``render_messages``. Facts keep their similarity order, each with its event date span
    (``render_fact``), so "prefer the most recent" compares when things happened, not when they were stored.
    """
    parts: list[str] = []
    if result.episodes:
        parts.append("Episodes (most relevant first):")
        parts += [f"- {render_episode(s.episode)}" for s in result.episodes]
    raw = [s.episode for s in result.episodes[:raw_top_r] if s.episode.messages]
    if raw:
        parts.append("Original messages of the top episodes:")
        for ep in raw:
            parts.append(render_messages(ep.messages, max_chars, resolve_dates=resolve_dates))
    if result.semantic:
        parts.append("Known facts:")
        parts += [f"- {render_fact(s.entry)}" for s in result.semantic]
    text = "\n".join(parts)
    return clip(text, budget) if budget else text
