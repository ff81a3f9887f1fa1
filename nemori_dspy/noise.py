"""Deterministic guard against machine noise reaching semantic memory (our addition, not in the paper).

Agents' conversations carry machine output: a pasted Python traceback, heartbeat pings, cron log lines.
A small distiller turns them into "facts" ("The user got a KeyError in line 12"). The rules here are
plain patterns, so they are reliable where they fire and leave everything else alone:

* a Python traceback block: from ``Traceback (most recent call last):`` through its exception line
  (chained tracebacks included), and stray ``File "…", line N`` frame lines;
* heartbeat lines: ``heartbeat``/``keepalive``/``health check`` followed by a status word, a number
  or ``key=value`` (``[heartbeat] ok``, ``HEARTBEAT seq=42``), not a sentence ("Heartbeat is racing");
* cron lines: syslog's ``CRON[1234]: (root) CMD (…)`` and crontab entries ``*/5 * * * * cmd``.

Raw messages stay in their episode; only what the distiller sees is cleaned.
"""

from __future__ import annotations

import re

__all__ = ["strip_noise", "is_noise_insight", "NOISE_MARK"]

#: what replaces removed machine output inside a message that also holds human text.
NOISE_MARK = "[machine output omitted]"

_TB_START = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_TB_CHAIN = re.compile(r"^\s*(During handling of the above exception|The above exception was the direct cause)")
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
_FRAME_ANY = re.compile(r'\bFile "[^"]+", line \d+')
_EXC_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b(?::.*)?$")
_HEARTBEAT = re.compile(
    r"^\s*[\[(<]?(?:heartbeat|keep-?alive|health[-_ ]?check)[\])>:]?\s*"
    r"(?:$|ok\b|alive\b|up\b|received\b|sent\b|ping\b|pong\b|\d|[\w-]+=|[-–:]\s*(?:ok|alive|up)\b)", re.I)
_CRON = re.compile(r"\bCRON\[\d+\]:|\(\w+\) CMD \(|^\s*(?=\S*\*)(?:[\d*/,-]+\s+){4}[\d*/,-]+\s+\S")


def _noise_line(line: str) -> bool:
    return bool(_FRAME.match(line) or _HEARTBEAT.match(line) or _CRON.search(line))


def _traceback_end(lines: list[str], i: int) -> int:
    """Index just past the traceback block starting at ``lines[i]`` (a ``Traceback`` header)."""
    j = i + 1
    while j < len(lines):
        line = lines[j]
        if _EXC_LINE.match(line) and not line.startswith((" ", "\t")):
            j += 1
            k = j
            while k < len(lines) and not lines[k].strip():
                k += 1
            if k < len(lines) and _TB_CHAIN.match(lines[k]):
                j = k + 1
                continue
            return j
        if line.strip() and not line.startswith((" ", "\t")) and not _TB_START.match(line):
            return j  # the block ended without an exception line
        j += 1
    return j


def strip_noise(text: str) -> str:
    """``text`` without traceback blocks, frame lines, heartbeat and cron lines.

    Returns "" when nothing else is left; when human text remains, each removed run is replaced by
    ``NOISE_MARK`` so the reader knows something was there. Text without noise comes back unchanged.
    """
    lines = text.splitlines()
    out: list[str] = []
    removed = False
    i = 0
    while i < len(lines):
        if _TB_START.match(lines[i]):
            i = _traceback_end(lines, i)
        elif _noise_line(lines[i]):
            i += 1
        else:
            out.append(lines[i])
            i += 1
            continue
        removed = True
        if not out or out[-1] != NOISE_MARK:
            out.append(NOISE_MARK)
    if not removed:
        return text
    kept = [ln for ln in out if ln != NOISE_MARK]
    return "\n".join(out).strip() if any(ln.strip() for ln in kept) else ""


def is_noise_insight(text: str) -> bool:
    """True if an insight quotes machine output: a traceback or frame line, an exception line such as
    ``KeyError: 'x'`` at its start, or a heartbeat/cron line."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return (bool(_EXC_LINE.match(first) or _FRAME_ANY.search(text)) or "Traceback (most recent call last)" in text
            or strip_noise(text) != text)
