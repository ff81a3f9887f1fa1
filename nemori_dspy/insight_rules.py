"""Deterministic rules for what is not a fact, applied to P_dis / Nemori-s insights (our addition, issue 10).

A small distiller often copies chat lines instead of distilling knowledge: ``"Caroline: Hey Mel! Good to
see you!"``, ``"What kinda jobs are you thinkin' of?"``. Such an "insight" holds nothing the episode does not
already keep verbatim (the raw message stays in episodic memory), costs a P_con call, and as a candidate
invites P_con to "conflict" it away with a true fact. The rules fire only where they are reliable:

* **question**: the insight ends with ``?`` — a question states no fact;
* **chat line**: it starts with ``<speaker>:`` for a speaker of the episode — the message format, never a
  third-person statement;
* **verbatim copy**: its text matches one of the episode's messages (case, spacing and punctuation aside) with
  a ``difflib`` ratio of at least ``COPY_RATIO`` *and* names no speaker the message does not already name (P_dis
  asks for self-contained sentences naming the person: ``"Caroline said: I went to a support group"`` names her
  and is kept, ``"I'm keen on counseling"`` copied from her line is not).

Everything else is kept, including first-person statements that rephrase a message.
"""

from __future__ import annotations

import difflib
import re
__all__ = ["COPY_RATIO", "not_a_fact", "is_question", "is_chat_line", "is_verbatim_copy", "message_lines"]

#: difflib ratio at or above which an insight is a copy of a message: a copy with a date resolved
#: ("yesterday" → "on 7 May 2023 (yesterday)") or a name expanded still scores > 0.9, while a fact
#: restating a message in the third person ("Caroline went to an LGBTQ support group on 7 May 2023.") scores
#: below 0.75 against "I went to a LGBTQ support group yesterday and it was so powerful."
COPY_RATIO = 0.85

_WORDS = re.compile(r"[\w']+")
_LINE = re.compile(r"^\s*(?:\d+\.\s*)?(?:\[[^\]]*\]\s*)?([^:\[\]]{1,80}):\s?(.*)$")


def message_lines(rendered: str) -> list[tuple[str, str]]:
    """(speaker, content) of each ``[YYYY-MM-DD HH:MM] speaker: text`` or ``speaker: text`` line of ``rendered``
    (what P_dis was shown, ``formatting.render_messages`` in either ``message_timestamps`` layout); other lines,
    such as a time line ``[YYYY-MM-DD HH:MM]`` on its own, are skipped."""
    return [(m.group(1).strip(), m.group(2)) for m in map(_LINE.match, rendered.splitlines()) if m]


def _key(text: str) -> str:
    return " ".join(_WORDS.findall(text.casefold()))


def is_question(insight: str) -> bool:
    """True if ``insight`` ends with a question mark (after closing quotes/brackets)."""
    return insight.rstrip(" \t\"')]}").endswith("?")


def is_chat_line(insight: str, speakers: set[str]) -> bool:
    """True if ``insight`` starts with ``<speaker>:`` for one of ``speakers`` (case-insensitive)."""
    head, sep, _ = insight.partition(":")
    return bool(sep) and head.strip().strip("[*\"'").casefold() in {s.casefold() for s in speakers}


def _names(key: str, speakers: set[str]) -> int:
    words = key.split()
    return sum(words.count(s) for s in speakers)


def is_verbatim_copy(insight: str, messages: list[tuple[str, str]]) -> bool:
    """True if ``insight`` matches a message's content (``messages``: (speaker, content) pairs) with a ``difflib``
    ratio ≥ ``COPY_RATIO`` and names no speaker (first names, case-insensitive) more often than that message does."""
    key = _key(insight)
    if not key:
        return False
    speakers = {w for speaker, _ in messages for w in _key(speaker).split()}
    for _, content in messages:
        other = _key(content)
        if not other or 2 * min(len(key), len(other)) < COPY_RATIO * (len(key) + len(other)):
            continue  # the ratio cannot reach COPY_RATIO: lengths too different
        m = difflib.SequenceMatcher(None, key, other, autojunk=False)
        if (m.quick_ratio() >= COPY_RATIO and m.ratio() >= COPY_RATIO
                and _names(key, speakers) <= _names(other, speakers)):
            return True
    return False


def not_a_fact(insight: str, rendered_messages: str | list[tuple[str, str]]) -> str | None:
    """Why ``insight`` is not a fact of the episode whose messages P_dis saw as ``rendered_messages`` (one
    ``[YYYY-MM-DD HH:MM] speaker: text`` or ``speaker: text`` line each, or those lines already split by
    ``message_lines``):
    ``"question"``, ``"chat_line"``, ``"verbatim_copy"``, or None when it is kept."""
    if is_question(insight):
        return "question"
    messages = message_lines(rendered_messages) if isinstance(rendered_messages, str) else rendered_messages
    if is_chat_line(insight, {speaker for speaker, _ in messages}):
        return "chat_line"
    if is_verbatim_copy(insight, messages):
        return "verbatim_copy"
    return None
