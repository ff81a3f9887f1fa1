"""Rendering of memory records into the text fields signatures take (data layout, no instructions)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Sequence

from .temporal import annotate_relative_dates
from .types import Episode, SearchResult, SemanticEntry, StoredMessage, instant

__all__ = ["MIN_MESSAGE_CHARS", "render_messages", "render_numbered_messages", "render_episode", "render_candidates",
           "render_entries", "entry_texts", "render_fact", "strip_fact_date", "render_context", "date_span", "clip",
           "per_message_chars", "render_groups", "render_insight_candidates", "render_cue", "fit_context",
           "count_tokens", "CONTEXT_HEADERS", "CHRONOLOGICAL_FACTS_HEADER", "chronological_facts", "TIMESTAMP_LAYOUTS"]


def clip(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` characters, marking the cut with ``…[truncated N chars]``."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f" …[truncated {len(text) - max_chars} chars]"


#: a message is never clipped below this many characters, however many messages share a prompt's budget:
#: about two sentences, enough to keep who did what and when. The floor wins over the budget, so a prompt of
#: very many messages may exceed ``max_prompt_chars`` (a window of w = 20 at the floor is 4,000 characters, of
#: w = 40 8,000).
MIN_MESSAGE_CHARS = 200


def per_message_chars(n: int, max_chars: int, budget: int | None) -> int:
    """Characters each of ``n`` messages may use: ``max_chars``, shrunk so n of them fit ``budget``, but
    never below ``MIN_MESSAGE_CHARS``."""
    if budget is None or n == 0:
        return max_chars
    return max(MIN_MESSAGE_CHARS, min(max_chars, budget // n))


#: how messages show their timestamps (``message_timestamps``): "per_message" puts ``[YYYY-MM-DD HH:MM]`` on every
#: line (the paper's layout); "on_change" puts it on a line of its own before the first message and again only
#: where it changes, so a run of messages sent at one time shares one stamp (LoCoMo dates whole sessions).
TIMESTAMP_LAYOUTS = ("per_message", "on_change")


def _stamp(m: StoredMessage) -> str:
    return f"[{m.timestamp:%Y-%m-%d %H:%M}]"


def _dated_lines(messages: Sequence[StoredMessage], body: Callable[[StoredMessage], str], timestamps: str,
                 numbered: bool = False) -> str:
    """One ``speaker: body(m)`` line per message (``n. `` first when ``numbered``, n from 1), dated as
    ``timestamps`` says (``TIMESTAMP_LAYOUTS``).

    Raises:
        ValueError: ``timestamps`` is not one of ``TIMESTAMP_LAYOUTS``.
    """
    if timestamps not in TIMESTAMP_LAYOUTS:
        raise ValueError(f"timestamps={timestamps!r}. Fix: use one of {', '.join(TIMESTAMP_LAYOUTS)}.")
    out: list[str] = []
    last = None
    for i, m in enumerate(messages, 1):
        num, stamp, text = f"{i}. " if numbered else "", _stamp(m), f"{m.speaker}: {body(m)}"
        if timestamps == "per_message":
            out.append(f"{num}{stamp} {text}")
            continue
        if stamp != last:
            out.append(stamp)
            last = stamp
        out.append(num + text)
    return "\n".join(out)


def render_messages(messages: Sequence[StoredMessage], max_chars: int = 4000, budget: int | None = None,
                    resolve_dates: bool = False, timestamps: str = "per_message") -> str:
    """One line per message: ``[YYYY-MM-DD HH:MM] speaker: content`` (``timestamps="on_change"``: ``speaker:
    content`` under a ``[YYYY-MM-DD HH:MM]`` line shown where the time changes); each content clipped so that a
    message has at most ``max_chars`` and all of them together about ``budget`` characters. With
    ``resolve_dates``, relative expressions get their absolute date appended (``temporal.py``)."""
    cap = per_message_chars(len(messages), max_chars, budget)

    def content(m: StoredMessage) -> str:
        text = clip(m.content, cap)
        return annotate_relative_dates(text, m.timestamp) if resolve_dates else text

    return _dated_lines(messages, content, timestamps)


def render_numbered_messages(messages: Sequence[StoredMessage], max_chars: int = 4000,
                             budget: int | None = None, timestamps: str = "per_message") -> str:
    """Like ``render_messages`` with 1-based numbers: ``3. [2023-05-08 13:56] Caroline: ...`` (``on_change``:
    ``3. Caroline: ...`` under its time line)."""
    cap = per_message_chars(len(messages), max_chars, budget)
    return _dated_lines(messages, lambda m: clip(m.content, cap), timestamps, numbered=True)


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


def render_cue(ep: Episode) -> str:
    """``(date span) cue`` of one episode (its narrative left out)."""
    return f"({date_span(ep.start, ep.end)}) {ep.cue}"


def render_candidates(eps: Sequence[Episode], cues_only: bool = False) -> str:
    """Numbered candidates ``[k] (span) cue: narrative`` (``[k] (span) cue`` with ``cues_only``), k from 1."""
    show = render_cue if cues_only else render_episode
    return "\n".join(f"[{k}] {show(ep)}" for k, ep in enumerate(eps, 1))


def render_groups(groups: Sequence[Sequence[StoredMessage]], max_chars: int = 4000, budget: int | None = None,
                  resolve_dates: bool = False, timestamps: str = "per_message") -> str:
    """``Group g:`` (g from 1) followed by that group's ``render_messages`` lines; ``budget`` characters are
    shared among the groups in proportion to their message counts."""
    total = sum(len(g) for g in groups) or 1
    return "\n".join(
        f"Group {g}:\n" + render_messages(msgs, max_chars, None if budget is None else budget * len(msgs) // total,
                                          resolve_dates, timestamps)
        for g, msgs in enumerate(groups, 1))


def render_insight_candidates(items: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Batched P_con input: ``Insight q: text`` (q from 1) then its entries as indented ``[i] text`` lines
    (i from 1 per insight); pass ``render_fact`` texts to show event dates."""
    blocks = []
    for q, (insight, entries) in enumerate(items, 1):
        blocks.append("\n".join([f"Insight {q}: {insight}", *(f"  [{i}] {t}" for i, t in enumerate(entries, 1))]))
    return "\n".join(blocks)


_FACT_DATE = re.compile(r"^\s*\(\d{4}-\d{2}-\d{2}(?: to \d{4}-\d{2}-\d{2})?\)\s*")


def strip_fact_date(text: str) -> str:
    """``text`` without a leading ``render_fact`` date prefix: ``"(2023-05-08) Bob ..."`` → ``"Bob ..."``."""
    return _FACT_DATE.sub("", text, count=1)


def render_entries(texts: Sequence[str]) -> str:
    """Numbered entries ``[i] text`` from 1, or ``(none)``; pass ``render_fact`` texts to show event dates."""
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts, 1)) or "(none)"


_ENTRY_LINE = re.compile(r"^\[\d+\]\s*(.*)$", re.M)


def entry_texts(rendered: str) -> list[str]:
    """The texts of ``render_entries`` output, in order (``(none)`` → []); a ``render_fact`` date prefix stays."""
    return _ENTRY_LINE.findall(rendered)


#: section headers of the answer context, in the paper's order (§3.4): episodes, raw messages, facts.
CONTEXT_HEADERS = ("Episodes (most relevant first):", "Original messages of the top episodes:", "Known facts:")
#: The facts header when facts are listed by event time (``facts_order="chronological"``).
CHRONOLOGICAL_FACTS_HEADER = "Known facts (oldest first; a later fact updates an earlier one):"


def count_tokens(text: str) -> int:
    """Tokens of ``text`` by litellm's default tokenizer (the count the eval reports as ``context_tokens``)."""
    import litellm

    return litellm.token_counter(text=text) if text else 0


def render_context(result: SearchResult, raw_top_r: int, max_chars: int = 4000, budget: int | None = None,
                   resolve_dates: bool = False, raw_ids: Collection[str] | None = None,
                   timestamps: str = "per_message", facts_header: str = CONTEXT_HEADERS[2]) -> str:
    """Answer context (§3.4): narratives of the top-k episodes, raw messages of the top-r, semantic facts,
    clipped to ``budget`` characters in all. Returns "" when nothing was retrieved. ``resolve_dates`` as
    in ``render_messages``, ``timestamps`` too. Facts keep their similarity order, each with its event date span
    (``render_fact``), so "prefer the most recent" compares when things happened, not when they were stored.
    ``raw_ids`` (from ``fit_context``) limits raw messages to those of the top-r episodes among these ids.
    """
    parts: list[str] = []
    if result.episodes:
        parts.append(CONTEXT_HEADERS[0])
        parts += [f"- {render_episode(s.episode)}" for s in result.episodes]
    raw = [s.episode for s in result.episodes[:raw_top_r]
           if s.episode.messages and (raw_ids is None or s.episode.id in raw_ids)]
    if raw:
        parts.append(CONTEXT_HEADERS[1])
        for ep in raw:
            parts.append(render_messages(ep.messages, max_chars, resolve_dates=resolve_dates, timestamps=timestamps))
    if result.semantic:
        parts.append(facts_header)
        parts += [f"- {render_fact(s.entry)}" for s in result.semantic]
    text = "\n".join(parts)
    return clip(text, budget) if budget else text


def chronological_facts(result: SearchResult, naive_timezone: str = "UTC") -> SearchResult:
    """``result`` with its facts listed by event time, oldest first (undated ones first, in their rank order), so
    that of two facts that disagree the newer is the one nearer the question (``facts_order="chronological"``,
    our addition; the paper lists them by similarity, §3.4)."""
    def key(hit: Any) -> tuple[int, datetime]:
        end = hit.entry.event_end
        return (0, datetime.min.replace(tzinfo=timezone.utc)) if end is None else (1, instant(end, naive_timezone))

    return result.model_copy(update={"semantic": sorted(result.semantic, key=key)})


def _ranked_items(result: SearchResult, raw_top_r: int) -> list[tuple[str, int]]:
    """Context items as (kind, rank index) in admission order: every episode's narrative by rank first, then, for
    i = 0, 1, ..., episode i's raw messages if i < r and its share of the facts (m/k per episode, rounded up).

    Narratives go first so that a cap never drops a retrieved episode for a better one's raw messages: with
    whole-topic episodes, rank-by-rank admission (episode i, its raw, its facts) filled the 2,000-token cap before
    the last retrieved episode on 4 of 124 slice questions and cost recall@10 (0.976 against 1.000 uncapped).
    """
    eps, facts = result.episodes, result.semantic
    per = math.ceil(len(facts) / len(eps)) if eps else len(facts)
    rounds = max(len(eps), math.ceil(len(facts) / per) if per else 0)
    items: list[tuple[str, int]] = [("episode", i) for i in range(len(eps))]
    for i in range(rounds):
        if i < min(raw_top_r, len(eps)) and eps[i].episode.messages:
            items.append(("raw", i))
        items += [("fact", j) for j in range(i * per, min((i + 1) * per, len(facts)))]
    return items


def _item_text(result: SearchResult, kind: str, i: int, max_chars: int, resolve_dates: bool, timestamps: str) -> str:
    if kind == "raw":
        return render_messages(result.episodes[i].episode.messages, max_chars, resolve_dates=resolve_dates,
                               timestamps=timestamps)
    if kind == "episode":
        return f"- {render_episode(result.episodes[i].episode)}"
    return f"- {render_fact(result.semantic[i].entry)}"


def fit_context(result: SearchResult, raw_top_r: int, max_tokens: int, count: Callable[[str], int] = count_tokens,
                max_chars: int = 4000, resolve_dates: bool = False,
                timestamps: str = "per_message") -> tuple[SearchResult, set[str]]:
    """The retrieved items that fit an answer context of ``max_tokens`` tokens (``answer_context_tokens``).

    Items are admitted in ``_ranked_items`` order while they fit (one that does not is skipped and smaller
    later ones may still enter); raw messages only with their episode. Rendering keeps the paper's section
    order (``render_context`` with the returned ``raw_ids``); if the rendered text still exceeds the cap,
    the last admitted items are dropped until it fits.

    Returns:
        (kept SearchResult in rank order, ids of the episodes whose raw messages are kept).
    """
    used, admitted = sum(count(h) + 1 for h in CONTEXT_HEADERS), []
    for kind, i in _ranked_items(result, raw_top_r):
        if kind == "raw" and ("episode", i) not in admitted:
            continue
        cost = count(_item_text(result, kind, i, max_chars, resolve_dates, timestamps)) + 1
        if used + cost <= max_tokens:
            admitted.append((kind, i))
            used += cost
    while True:
        kept, raw_ids = _kept(result, admitted)
        if not admitted or count(render_context(kept, raw_top_r, max_chars, None, resolve_dates, raw_ids,
                                                        timestamps)) <= max_tokens:
            return kept, raw_ids
        admitted.pop()


def _kept(result: SearchResult, admitted: list[tuple[str, int]]) -> tuple[SearchResult, set[str]]:
    """``result`` restricted to the admitted items (rank order kept), and the ids whose raw messages stay."""
    eps = [s for i, s in enumerate(result.episodes) if ("episode", i) in admitted]
    facts = [s for i, s in enumerate(result.semantic) if ("fact", i) in admitted]
    raw_ids = {result.episodes[i].episode.id for kind, i in admitted if kind == "raw"}
    return result.model_copy(update={"episodes": eps, "semantic": facts}), raw_ids
