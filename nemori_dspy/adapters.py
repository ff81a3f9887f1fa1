"""DSPy adapters that read "nothing" as an empty list: prompts unchanged, only parsing is more lenient.

A small model asked for a list of insights often answers ``none``, ``null``, ``N/A``, an empty field
or ``[None]`` when there is nothing to add; DSPy's adapters accept only ``[]``, so such a reply costs a
JSON-adapter fallback call and re-asks before the stage is parked. ``LenientChatAdapter`` and
``LenientJSONAdapter`` render exactly what ``dspy.ChatAdapter``/``dspy.JSONAdapter`` render (same
messages, so the same cache keys and ``signature_hash``); only when DSPy's own parse fails do they
read an empty-like value of a *flat* list output field (``list[str]``, ``list[int]``: P_dis/Nemori-s
insights, P_con targets) as ``[]`` and parse again. Anything else still fails as before.
"""

from __future__ import annotations

import json
import re
from typing import Any, get_args, get_origin

import dspy
import json_repair
from dspy.adapters.chat_adapter import field_header_pattern
from dspy.utils.exceptions import AdapterParseError

__all__ = ["LenientChatAdapter", "LenientJSONAdapter", "is_empty_reply", "make_adapter"]

#: what a model writes for "no items", after quotes, brackets, fences, bullets and end punctuation go.
_EMPTY_WORDS = frozenset({"", "none", "null", "nil", "n/a", "na", "nothing", "empty", "no insights",
                          "no new insights", "no facts", "no new facts", "no new information"})
_WRAPPING = re.compile(r"^(?:```(?:json)?|[\s\[\](){}'\"`*•-])+|(?:```|[\s\[\](){}'\"`.!])+$", re.IGNORECASE)


def is_empty_reply(text: str) -> bool:
    """True if ``text`` says "no items": ``""``, ``none``, ``null``, ``N/A``, ``[None]``, ``- none``,
    ``No new insights.`` and the like (case-insensitive). ``"Caroline has none."`` is not."""
    return _WRAPPING.sub("", text.strip()).strip().lower() in _EMPTY_WORDS


def _flat_list_fields(signature: type[dspy.Signature]) -> set[str]:
    """Output fields annotated ``list[str]`` or ``list[int]``."""
    return {name for name, f in signature.output_fields.items()
            if get_origin(f.annotation) is list and get_args(f.annotation) in ((str,), (int,))}


def _empty_chat_sections(signature: type[dspy.Signature], completion: str) -> str | None:
    """``completion`` with each empty-like flat-list section replaced by ``[]``; None if none was."""
    lists, out, changed = _flat_list_fields(signature), [], False
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in completion.splitlines():
        m = field_header_pattern.match(line.strip())
        if m:
            rest = line.strip()[m.end():].strip()
            blocks.append((m.group(1), [rest] if rest else []))
        else:
            blocks[-1][1].append(line)
    for name, lines in blocks:
        if name is not None:
            out.append(f"[[ ## {name} ## ]]")
        if name in lists and is_empty_reply("\n".join(lines)) and "\n".join(lines).strip() != "[]":
            lines, changed = ["[]"], True
        out.extend(lines)
    return "\n".join(out) if changed else None


class LenientChatAdapter(dspy.ChatAdapter):
    """``dspy.ChatAdapter`` that reads an empty-like flat-list field as ``[]`` when its parse fails."""

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
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


class LenientJSONAdapter(dspy.JSONAdapter):
    """``dspy.JSONAdapter`` that reads a null or empty-like flat-list value as ``[]`` when its parse fails."""

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        try:
            return super().parse(signature, completion)
        except AdapterParseError:
            fields = json_repair.loads(completion)
            if not isinstance(fields, dict):
                raise
            lists = _flat_list_fields(signature)
            empty = [k for k, v in fields.items() if k in lists and (v is None or (isinstance(v, str)
                                                                                  and is_empty_reply(v)))]
            if not empty:
                raise
            return super().parse(signature, json.dumps({**fields, **dict.fromkeys(empty, [])}))


def make_adapter(name: str) -> dspy.ChatAdapter:
    """The adapter of the ``adapter`` setting: ``"chat"`` → ``LenientChatAdapter``, ``"json"`` →
    ``LenientJSONAdapter``."""
    return LenientJSONAdapter() if name == "json" else LenientChatAdapter()
