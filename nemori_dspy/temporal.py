"""Relative time expressions ("last week", "yesterday", "3 days ago") resolved against a message's timestamp.

The paper's narration and distillation prompts ask the LLM to turn relative dates into absolute ones
(§3.2.2, Appendix D.1.2). Large models do; a 0.5B local model copies "last week" verbatim, so a memory
built with it cannot answer LoCoMo's temporal questions. ``annotate_relative_dates`` writes the absolute
date in place of each relative expression it recognises, keeping the original words in brackets —
``in the week of 17 May 2023 (last week)`` — before the text reaches a prompt, so any model can copy it
(a small narrator drops a trailing ``(= …)`` note but keeps the absolute-first form). The date arithmetic is ``dateparser``'s; this module
only finds the expressions (``dateparser.search`` misses "last week" and reads "we"/"may" as dates).
"""

from __future__ import annotations

import calendar
import re
from datetime import date, datetime, timedelta
from functools import lru_cache

import dateparser

__all__ = ["annotate_relative_dates", "resolve_relative_date", "RELATIVE_DATE_PATTERN", "strip_relative_notes",
           "date_spans", "date_mentions", "dates_agree", "spans_overlap"]

_NUM = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|a couple of|couple of)"
_UNIT = r"(?:day|week|month|year)s?"
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_PATTERN = re.compile(
    r"\b(?:the day before yesterday|the day after tomorrow|yesterday|tomorrow|today|tonight|last night"
    rf"|(?:last|next|this) (?:week|month|year|weekend|{_WEEKDAY})"
    rf"|{_NUM} {_UNIT} ago|in {_NUM} {_UNIT})\b",
    re.IGNORECASE,
)
#: the relative expressions this module recognises (also used by the narrate metric to find unresolved ones).
RELATIVE_DATE_PATTERN = _PATTERN
_FEW = {"a few": "3", "a couple of": "2", "couple of": "2"}
_PREPOSITION = re.compile(r"\b(?:since|until|till|from|by|before|after|in|on|of|at|during|for|to)\s*$", re.IGNORECASE)


def _granularity(expr: str) -> str:
    low = expr.lower()
    for unit in ("weekend", "week", "month", "year"):
        if unit in low:
            return unit
    return "day"


@lru_cache(maxsize=4096)
def _parse(expr: str, base: datetime) -> datetime | None:
    settings = {"RELATIVE_BASE": base, "PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False}
    return dateparser.parse(expr, languages=["en"], settings=settings)


def resolve_relative_date(expr: str, when: datetime) -> str | None:
    """Absolute date meant by one relative expression said at ``when``, as text; None if not resolvable.

    Granularity follows the expression: days → ``23 May 2023``; weeks and weekends → ``the week of
    17 May 2023`` (the date ``when`` − 7 days for "last week"); months → ``June 2023``; years → ``2022``.
    ``today``/``tonight`` resolve to the day of ``when``.

    Args:
        expr: a relative expression as matched in the text, e.g. ``"last week"``, ``"3 days ago"``.
        when: timestamp of the message that contains it (naive or aware; the tz is dropped).
    """
    low = expr.lower()
    for few, n in _FEW.items():
        low = low.replace(few, n)
    low = low.replace("weekend", "week")  # dateparser has no weekend; the week is the honest granularity
    base = when.replace(tzinfo=None)
    day = base if low in ("today", "tonight") else _parse(low, base)
    if day is None:
        return None
    unit = _granularity(expr)
    if unit in ("week", "weekend"):
        return f"the week of {day.day} {day:%B %Y}"
    if unit == "month":
        return f"{day:%B %Y}"
    if unit == "year":
        return f"{day:%Y}"
    return f"{day.day} {day:%B %Y}"


def annotate_relative_dates(text: str, when: datetime) -> str:
    """``text`` with every relative time expression replaced by ``<absolute date> (<expression>)``.

    The absolute date gets "on" (days) or "in" (weeks, months, years) unless a preposition already
    precedes it. Example: ``"I went to Paris last week"`` said at 2023-05-24 10:00 →
    ``"I went to Paris in the week of 17 May 2023 (last week)"``. Text without such expressions comes
    back unchanged; expressions that cannot be resolved are left as they are.

    Args:
        text: message content.
        when: the message's timestamp.
    """
    def note(match: re.Match[str]) -> str:
        expr = match.group(0)
        absolute = resolve_relative_date(expr, when)
        if absolute is None:
            return expr
        if not _PREPOSITION.search(text[: match.start()]):
            absolute = ("on " if _granularity(expr) == "day" else "in ") + absolute
        return f"{absolute} ({expr})"

    return _PATTERN.sub(note, text)


def strip_relative_notes(text: str) -> str:
    """``text`` without the ``(<relative expression>)`` notes ``annotate_relative_dates`` wrote after an absolute date:
    ``"Caroline went to a support group on 7 May 2023 (yesterday)."`` → ``"... on 7 May 2023."``. A fact outlives the
    day it was said on, so "(yesterday)" would mislead every later reader; a parenthesis holding anything else stays."""
    def drop(match: re.Match[str]) -> str:
        inner = match.group(1)
        return "" if _PATTERN.fullmatch(inner.strip()) else match.group(0)

    return re.sub(r"\s*\(([^()]{1,40})\)", drop, text)


_MONTH_NAMES = "january|february|march|april|may|june|july|august|september|october|november|december"
_MONTH_NUMBER = {name: i for i, name in enumerate(_MONTH_NAMES.split("|"), 1)}
_ABSOLUTE = re.compile(
    rf"\b(?:(?P<week>the week of )?(?P<d1>\d{{1,2}})(?:st|nd|rd|th)? (?P<m1>{_MONTH_NAMES}),? (?P<y1>\d{{4}})"
    rf"|(?P<m2>{_MONTH_NAMES}) (?P<d2>\d{{1,2}})(?:st|nd|rd|th)?,? (?P<y2>\d{{4}})"
    rf"|(?P<m3>{_MONTH_NAMES}),? (?P<y3>\d{{4}})"
    rf"|(?P<d5>\d{{1,2}})(?:st|nd|rd|th)? (?P<m5>{_MONTH_NAMES})"
    r"|(?P<iso>\d{4}-\d{2}-\d{2})"
    r"|(?P<y4>(?:19|20)\d{2}))\b",
    re.IGNORECASE,
)
DateSpan = tuple[date, date]


def _span(m: re.Match[str], year: int | None) -> DateSpan | None:
    g = m.groupdict()
    try:
        if g["d5"]:
            if year is None:
                return None
            day = date(year, _MONTH_NUMBER[g["m5"].lower()], int(g["d5"]))
            return day, day
        if g["iso"]:
            day = date.fromisoformat(g["iso"])
            return day, day
        if g["y4"]:
            year = int(g["y4"])
            return date(year, 1, 1), date(year, 12, 31)
        if g["m3"]:
            year, month = int(g["y3"]), _MONTH_NUMBER[g["m3"].lower()]
            return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])
        d, mon, y = (g["d1"], g["m1"], g["y1"]) if g["d1"] else (g["d2"], g["m2"], g["y2"])
        day = date(int(y), _MONTH_NUMBER[mon.lower()], int(d))
    except ValueError:  # 31 February, month 13: no date
        return None
    return (day, day + timedelta(days=6)) if g["week"] else (day, day)


def date_mentions(text: str, year: int | None = None) -> list[tuple[int, int, DateSpan]]:
    """``(start, end, span)`` of each absolute date ``text`` states (``date_spans``' forms), in order: where the
    words are, for a caller that rewrites them."""
    return [(m.start(), m.end(), span) for m in _ABSOLUTE.finditer(text) if (span := _span(m, year)) is not None]


def date_spans(text: str, year: int | None = None) -> list[DateSpan]:
    """The absolute dates ``text`` states, each as a closed span ``(first day, last day)``.

    Recognised: ``7 May 2023`` / ``May 7, 2023`` / ``2023-05-07`` (one day), ``the week of 7 May 2023`` (7 days),
    ``May 2023`` (the month), ``2022`` (the year, 1900–2099): the forms ``annotate_relative_dates`` writes and
    the pipeline's fact and episode dates; ``2 February`` too when ``year`` is given (a speaker's own date, read in
    the year the message was sent). Impossible dates (``31 February 2023``) are skipped.

    Returns:
        spans in the order found; ``[]`` when ``text`` states no date.
    """
    return [span for _, _, span in date_mentions(text, year)]


def spans_overlap(a: DateSpan, b: DateSpan) -> bool:
    """Whether two ``(first day, last day)`` spans (both ends inclusive) share at least one day."""
    return a[0] <= b[1] and b[0] <= a[1]


def dates_agree(claim: str, source: str, sent: str = "") -> bool:
    """Whether the dates ``claim`` (a fact or a narrative sentence) states agree with its ``source`` message text.

    Every date of the claim must overlap a date of the source or ``sent`` (when the message was sent, e.g.
    ``"May 2023"``), and when the source dates its event, at least one date of the claim must overlap one of the
    source's: "Sofia got married in June 2023" does not rest on "we got married in 2018 (5 years ago)" sent in
    June 2023, while "On 8 May 2023 Caroline said she went to a group on 7 May 2023" rests on a message of May 2023
    dating the group 7 May 2023. A claim without a date always agrees. Read relative dates resolved
    (``annotate_relative_dates``) on both sides.

    Args:
        claim: the text to check.
        source: the message content (without the speaker and stamp).
        sent: the text of the message's send date (any form ``date_spans`` reads; "" for unknown).
    """
    wanted = date_spans(claim)
    if not wanted:
        return True
    sent_spans = date_spans(sent)
    stated = date_spans(source, sent_spans[0][0].year if sent_spans else None)
    if stated and not any(spans_overlap(w, s) for w in wanted for s in stated):
        return False
    known = stated + sent_spans
    return all(any(spans_overlap(w, k) for k in known) for w in wanted)
