"""DSPy adapters that read "nothing" as an empty list: prompts unchanged, only parsing is more lenient.

A small model asked for a list of insights often answers ``none``, ``null``, ``N/A``, an empty field
or ``[None]`` when there is nothing to add; DSPy's adapters accept only ``[]``, so such a reply costs a
JSON-adapter fallback call and re-asks before the stage is parked. ``LenientChatAdapter`` and
``LenientJSONAdapter`` render exactly what ``dspy.ChatAdapter``/``dspy.JSONAdapter`` render (same
messages, so the same cache keys and ``signature_hash``); only when DSPy's own parse fails do they
read an empty-like value of a *flat* list output field (``list[str]``, ``list[int]``: P_dis/Nemori-s
insights, P_con targets) as ``[]`` and parse again. Anything else still fails as before.

A ``list[str]`` field (P_dis / Nemori-s insights) a small model writes one item per line, or as prose (a paragraph,
or a bracketed line of unquoted items), is read as those lines or sentences before DSPy parses it: json_repair
would read the first as one garbled item and split the second at every comma (``"reading"``, ``"but when I look
after myself"``, or the P_dis instruction's ``"relationships"``, ``"preferences"``, ``"plans"``). A Python list of
single-quoted items holding apostrophes (``['Evan and Sam's marriage is special, …']``) is split only between items
(``single_quoted_items``), not at every apostrophe and the comma after it.

Both also format faster, to the same bytes: the system message (field descriptions, structure with JSON
schemas, instructions) is a function of the signature alone, so it is built once per signature class and
instruction text and reused; a user message's plain ``str``/``int`` field values are written directly
instead of through pydantic's ``TypeAdapter`` per value (which builds a new adapter each call). These were
the two largest framework costs per LLM call (``python -m benchmarks.framework_overhead --profile``).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, get_args, get_origin

import dspy
import json_repair
from dspy.adapters.chat_adapter import field_header_pattern
from dspy.adapters.utils import format_field_value
from dspy.utils.exceptions import AdapterParseError

from .insight_rules import split_sentences

__all__ = ["LenientChatAdapter", "LenientJSONAdapter", "is_empty_reply", "make_adapter", "prose_items",
           "single_quoted_items"]

#: what a model writes for "no items", after quotes, brackets, fences, bullets and end punctuation go.
_EMPTY_WORDS = frozenset({"", "none", "null", "nil", "n/a", "na", "nothing", "empty", "no insights",
                          "no new insights", "no facts", "no new facts", "no new information"})
_WRAPPING = re.compile(r"^(?:```(?:json)?|[\s\[\](){}'\"`*•-])+|(?:```|[\s\[\](){}'\"`.!])+$", re.IGNORECASE)


def is_empty_reply(text: str) -> bool:
    """True if ``text`` says "no items": ``""``, ``none``, ``null``, ``N/A``, ``[None]``, ``- none``,
    ``No new insights.`` and the like (case-insensitive). ``"Caroline has none."`` is not."""
    return _WRAPPING.sub("", text.strip()).strip().lower() in _EMPTY_WORDS


def _flat_list_fields(signature: type[dspy.Signature], items: tuple[type, ...] = (str, int)) -> set[str]:
    """Output fields annotated ``list[T]`` for a ``T`` in ``items`` (default ``list[str]`` or ``list[int]``)."""
    return {name for name, f in signature.output_fields.items()
            if get_origin(f.annotation) is list and len(get_args(f.annotation)) == 1 and get_args(f.annotation)[0] in items}


def _sections(completion: str) -> list[tuple[str | None, list[str]]]:
    """A ChatAdapter reply split at its ``[[ ## name ## ]]`` headers: (field name, its lines); the text before the
    first header comes first, named None; a value on the header's own line is the section's first line."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in completion.splitlines():
        m = field_header_pattern.match(line.strip())
        if m:
            rest = line.strip()[m.end():].strip()
            blocks.append((m.group(1), [rest] if rest else []))
        else:
            blocks[-1][1].append(line)
    return blocks


def _rewrite_sections(completion: str, rewrite: Callable[[str | None, list[str]], list[str] | None]) -> str | None:
    """``completion`` with each section's lines replaced by ``rewrite(name, lines)`` where that is not None; None
    when no section was rewritten."""
    out, changed = [], False
    for name, lines in _sections(completion):
        if name is not None:
            out.append(f"[[ ## {name} ## ]]")
        new = rewrite(name, lines)
        changed |= new is not None
        out.extend(lines if new is None else new)
    return "\n".join(out) if changed else None


def _empty_chat_sections(signature: type[dspy.Signature], completion: str) -> str | None:
    """``completion`` with each empty-like flat-list section replaced by ``[]``; None if none was."""
    lists = _flat_list_fields(signature)

    def empty(name: str | None, lines: list[str]) -> list[str] | None:
        text = "\n".join(lines)
        return ["[]"] if name in lists and is_empty_reply(text) and text.strip() != "[]" else None

    return _rewrite_sections(completion, empty)


_ITEM_LINE = re.compile(r"^\s*(?:\[(?P<bracketed>.*?)\]?|(?:[-*•]|\d+[.)])\s+(?P<bulleted>.*))\s*$")


def _line_items(text: str) -> list[str] | None:
    """Items of a list written one per line, each ``[item]``, ``- item`` or ``1. item`` (a small model's way of
    writing ``list[str]``; the last line may lack its closing bracket when the reply was cut); None when a
    non-empty line is not such an item or there is just one line (a JSON list on one line is DSPy's to parse)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    items = []
    for ln in lines:
        m = _ITEM_LINE.match(ln)
        if m is None:
            return None
        items.append((m.group("bracketed") if m.group("bracketed") is not None else m.group("bulleted")).strip())
    return [i for i in items if i]


def _line_item_sections(signature: type[dspy.Signature], completion: str) -> str | None:
    """``completion`` with each ``list[str]`` section written one item per line replaced by its JSON list; None if
    no section was."""
    strings = _flat_list_fields(signature, (str,))

    def as_json(name: str | None, lines: list[str]) -> list[str] | None:
        items = _line_items("\n".join(lines)) if name in strings else None
        return None if items is None else [json.dumps(items, ensure_ascii=False)]

    return _rewrite_sections(completion, as_json)


#: a list[str] value DSPy parses well: a JSON list (maybe broken) whose first item is quoted, or an empty one.
_JSON_LIKE = re.compile(r"^\s*(?:```(?:json)?\s*)?\[\s*(?:[\"'{\]]|$)", re.IGNORECASE)


def prose_items(text: str) -> list[str] | None:
    """The items of a ``list[str]`` value a small model wrote as prose rather than a JSON list: its sentences.

    Covers a plain prose section (``Caroline adopted Rex, a beagle. Melanie paints.``) and a bracketed list of
    unquoted items (``[Caroline likes reading, but when I rest, I feel better.]``), which json_repair would split
    at every comma into fragments (``"but when I rest"``). Lines are read one by one (a bullet or bracket around
    a line is dropped; a lead-in line ending in ``:`` is no item), each split into sentences only at sentence ends,
    never at a comma inside a sentence.

    Returns None when ``text`` is for DSPy to parse: a JSON list whose first item is quoted (or ``[]``),
    or an empty-like reply (``is_empty_reply``: ``none``, ``N/A``, ...), or nothing is left.
    """
    if not text.strip() or _JSON_LIKE.match(text) or is_empty_reply(text):
        return None
    try:
        if isinstance(json.loads(text), list):
            return None
    except ValueError:
        pass
    body = text.strip()
    if body.startswith("["):
        body = body[1:].rstrip()
        body = body[:-1] if body.endswith("]") else body
    items: list[str] = []
    for line in body.splitlines():
        m = _ITEM_LINE.match(line)
        line = ((m.group("bracketed") if m.group("bracketed") is not None else m.group("bulleted"))
                if m else line).strip()
        if line and not line.endswith(":"):
            items += split_sentences(line)
    return items or None


#: a Python-style list of single-quoted strings on its own: ``['…', '…']`` (maybe with a trailing comma)
_SINGLE_QUOTED = re.compile(r"^\s*\[\s*'(?P<body>.*)'\s*,?\s*\]\s*$", re.DOTALL)
#: where one single-quoted item ends and the next begins: ``', '`` (any spacing, a line break allowed)
_ITEM_BREAK = re.compile(r"'\s*,\s*'")


def single_quoted_items(text: str) -> list[str] | None:
    """The items of a ``list[str]`` value written as a Python list of single-quoted strings whose items hold
    apostrophes: ``['Evan and Sam's marriage is special, and they feel lucky.', 'Evan's knee is healing.']``.

    json_repair reads each apostrophe as a quote and each comma after it as a separator (``"Evan and Sam"``,
    ``"s marriage is special"``, ``"and they feel lucky.'"``: 11 of 130 insights of one conv-49 build,
    2026-12-04). Items are split only where a quote, a comma and a quote meet (``', '``); an apostrophe inside a
    word stays. Returns None when ``text`` is no such list, or is valid JSON (DSPy's to parse), or no item holds an
    apostrophe (json_repair reads it right).
    """
    m = _SINGLE_QUOTED.match(text)
    if m is None or "'" not in m.group("body"):
        return None
    items = [i.strip() for i in _ITEM_BREAK.split(m.group("body"))]
    if not any("'" in i for i in items):
        return None
    return [i for i in items if i]


def _single_quoted_sections(signature: type[dspy.Signature], completion: str) -> str | None:
    """``completion`` with each ``list[str]`` section written as a single-quoted Python list whose items hold
    apostrophes (``single_quoted_items``) replaced by its JSON list; None if no section was."""
    strings = _flat_list_fields(signature, (str,))

    def as_json(name: str | None, lines: list[str]) -> list[str] | None:
        items = single_quoted_items("\n".join(lines)) if name in strings else None
        return None if items is None else [json.dumps(items, ensure_ascii=False)]

    return _rewrite_sections(completion, as_json)


def _prose_sections(signature: type[dspy.Signature], completion: str) -> str | None:
    """``completion`` with each ``list[str]`` section written as prose (``prose_items``) replaced by the JSON list of
    its sentences; None if no section was."""
    strings = _flat_list_fields(signature, (str,))

    def as_json(name: str | None, lines: list[str]) -> list[str] | None:
        items = prose_items("\n".join(lines)) if name in strings else None
        return None if items is None else [json.dumps(items, ensure_ascii=False)]

    return _rewrite_sections(completion, as_json)


class _FastFormat:
    """Mixin for a DSPy adapter: the same messages, built with less work (see the module docstring)."""

    def _system_cache(self) -> tuple[threading.Lock, dict[type, tuple[str, str]]]:
        cache = self.__dict__.get("_nemori_system_cache")
        if cache is None:
            cache = self.__dict__.setdefault("_nemori_system_cache", (threading.Lock(), {}))
        return cache

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        """DSPy's system message for ``signature``, from a per-adapter cache keyed by the signature class and
        checked against its current instructions."""
        lock, cache = self._system_cache()
        hit = cache.get(signature)
        if hit is not None and hit[0] == signature.instructions:
            return hit[1]
        text = super().format_system_message(signature)  # type: ignore[misc]
        with lock:
            cache[signature] = (signature.instructions, text)
        return text

    def format_field_with_value(self, fields_with_values: dict[Any, Any], *args: Any, **kwargs: Any) -> str:
        """DSPy's ``[[ ## name ## ]]`` sections of a user message; a value that is exactly ``str`` or ``int`` is
        written as ``str(value)`` (what ``dspy.adapters.utils.format_field_value`` returns for it, without
        building a pydantic ``TypeAdapter``), any other value goes through that function."""
        role = kwargs.get("role", args[0] if args else "user")
        if role != "user":
            return super().format_field_with_value(fields_with_values, *args, **kwargs)  # type: ignore[misc]
        parts = [f"[[ ## {f.name} ## ]]\n{v if type(v) in (str, int) else format_field_value(field_info=f.info, value=v)}"
                 for f, v in fields_with_values.items()]
        return "\n\n".join(parts).strip()


class LenientChatAdapter(_FastFormat, dspy.ChatAdapter):
    """``dspy.ChatAdapter`` that reads a ``list[str]`` written one item per line as that list, and an empty-like
    flat-list field as ``[]`` when its parse fails."""

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        """DSPy's parse, after a ``list[str]`` section written one item per line (``[item]`` / ``- item`` /
        ``1. item`` lines, which json_repair would read as one garbled item) or as prose (a plain paragraph, or a
        bracketed line of unquoted items, which json_repair would split at every comma: ``prose_items``) is
        rewritten as a JSON list; when that parse fails, an empty-like flat-list section is read as ``[]``."""
        completion = _line_item_sections(signature, completion) or completion
        completion = _single_quoted_sections(signature, completion) or completion
        completion = _prose_sections(signature, completion) or completion
        try:
            return super().parse(signature, completion)
        except AdapterParseError:
            repaired = _empty_chat_sections(signature, completion)
            if repaired is None:
                raise
            return super().parse(signature, repaired)

    def _make_json_adapter_fallback(self) -> dspy.JSONAdapter:
        return LenientJSONAdapter(use_native_function_calling=self.use_native_function_calling,
                                  parallel_tool_calls=self.parallel_tool_calls)


class LenientJSONAdapter(_FastFormat, dspy.JSONAdapter):
    """``dspy.JSONAdapter`` that reads a null or empty-like flat-list value as ``[]``, and a ``list[str]`` value
    written as one string of prose as its sentences (``prose_items``), when its parse fails."""

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        try:
            return super().parse(signature, completion)
        except AdapterParseError:
            fields = json_repair.loads(completion)
            if not isinstance(fields, dict):
                raise
            lists, strings = _flat_list_fields(signature), _flat_list_fields(signature, (str,))
            empty = [k for k, v in fields.items() if k in lists and (v is None or (isinstance(v, str)
                                                                                  and is_empty_reply(v)))]
            prose = {k: prose_items(v) for k, v in fields.items() if k in strings and k not in empty
                     and isinstance(v, str) and prose_items(v) is not None}
            if not empty and not prose:
                raise
            return super().parse(signature, json.dumps({**fields, **dict.fromkeys(empty, []), **prose}))


def make_adapter(name: str) -> dspy.ChatAdapter:
    """The adapter of the ``adapter`` setting: ``"chat"`` → ``LenientChatAdapter``, ``"json"`` →
    ``LenientJSONAdapter``."""
    return LenientJSONAdapter() if name == "json" else LenientChatAdapter()
