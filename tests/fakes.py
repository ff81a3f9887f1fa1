"""Scripted LMs for tests: replies are produced by Python functions per signature, then parsed by
the real DSPy adapters (ChatAdapter by default), through the real ``dspy.LM`` call path with a
custom engine (so caching, retries and history behave as in production)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Callable

import dspy
from dspy.lm15 import Message as LMMessage
from dspy.lm15 import Response, TextPart, Usage

from nemori_dspy.usage import UsageTrackingMixin

FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with |\Z)", re.S)

_SECTION = re.compile(r"Your input fields are:\n(.*?)Your output fields are:\n(.*?)(?:\nAll interactions|\Z)", re.S)
_NAME = re.compile(r"^\d+\. `(\w+)`", re.M)


def field_key(inputs: list[str], outputs: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A signature's identity as the adapter shows it: (input field names, output field names)."""
    return tuple(inputs), tuple(outputs)


def _routes() -> dict[tuple, str]:
    """field key → signature class name, for every pipeline signature (their field sets are unique).

    Routing by fields, never by instruction text: an optimizer rewrites instructions (and demos), the
    fields stay."""
    from nemori_dspy.signatures import SIGNATURES

    out: dict[tuple, str] = {}
    for name, sig in SIGNATURES.items():
        if name.startswith("judge_lme_"):
            continue  # the LongMemEval judges share fields; tests that need them route on top of this
        key = field_key(list(sig.input_fields), list(sig.output_fields))
        assert key not in out, f"two signatures with the same fields: {out[key]} and {sig.__name__}"
        out[key] = sig.__name__
    return out


#: field key → signature class name (see ``_routes``), plus DSPy's own optimizer signatures.
ROUTES = {**_routes(),
          field_key(["current_instruction", "examples_with_feedback"], ["new_instruction"]): "GEPAProposeInstruction"}


def signature_fields(system: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(input names, output names) listed in a ChatAdapter/JSONAdapter system message, or None."""
    m = _SECTION.search(system)
    if not m:
        return None
    return field_key(_NAME.findall(m.group(1)), _NAME.findall(m.group(2)))


def chat_reply(**fields: Any) -> str:
    """Format output fields as the ChatAdapter expects: ``[[ ## name ## ]]`` blocks + completed marker."""
    parts = []
    for k, v in fields.items():
        parts.append(f"[[ ## {k} ## ]]\n{v if isinstance(v, str) else json.dumps(v)}")
    return "\n\n".join(parts) + "\n\n[[ ## completed ## ]]"


def parse_inputs(text: str) -> dict[str, str]:
    """Input fields of a ChatAdapter user message, by name."""
    return {m.group(1): m.group(2).strip() for m in FIELD.finditer(text)}


class _Engine:
    def __init__(self, owner: "ScriptedLM") -> None:
        self.owner = owner

    def complete(self, request: Any) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in (request.system or []))
        user = request.messages[-1].text or ""
        text = self.owner.reply(system, user)
        return Response(id=None, model="scripted", message=LMMessage.assistant([TextPart(text)]),
                        finish_reason=getattr(self.owner, "finish_reason", "stop"),
                        usage=Usage(input_tokens=max(1, (len(system) + len(user)) // 4),
                                    output_tokens=max(1, len(text) // 4), total_tokens=0))

    def stream(self, request: Any):  # pragma: no cover - not used
        raise NotImplementedError

    def close(self) -> None:
        pass


class _AsyncEngine:
    def __init__(self, sync: _Engine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Response:
        return self.sync.complete(request)

    async def aclose(self) -> None:
        pass


Responder = Callable[[dict[str, str]], str]


class ScriptedLM(UsageTrackingMixin, dspy.LM):
    """A ``dspy.LM`` whose replies come from ``responders[signature_name](inputs) -> raw text``; the
    signature is recognised by its input/output field names (``route``), so rewritten instructions still route.

    ``calls`` counts calls per signature; ``prompts`` keeps (signature, inputs) in order.
    A responder may raise to simulate a provider error.
    """

    def __init__(self, responders: dict[str, Responder], cache: bool = False) -> None:
        engine = _Engine(self)
        super().__init__("openai/scripted", engine=engine, async_engine=_AsyncEngine(engine), cache=cache,
                         num_retries=0, temperature=0.0, max_tokens=512)
        self.responders = responders
        self.calls: dict[str, int] = {}
        self.prompts: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def route(self, system: str) -> str:
        """Signature class name of a prompt, from the field names the adapter lists (not the instruction)."""
        key = signature_fields(system)
        if key in ROUTES:
            return ROUTES[key]
        if key is None and "raw" in self.responders:  # a bare prompt (e.g. GEPA's reflection): no fields
            return "raw"
        raise AssertionError(f"unrouted prompt (fields {key}): {system[:200]}")

    def reply(self, system: str, user: str) -> str:
        name = self.route(system)
        inputs = parse_inputs(user) if name != "raw" else {"prompt": system + "\n" + user}
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.prompts.append((name, inputs))
        return self.responders[name](inputs)


def prompt_hash(inputs: dict[str, str]) -> int:
    """Stable integer from a prompt's inputs (for deterministic, replayable scripted replies)."""
    return int(hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:8], 16)


def default_responders(groups_of: int = 5) -> dict[str, Responder]:
    """Plausible, deterministic replies for every signature: fixed-size partitions, narratives that
    quote the messages, no merges, one insight per message line, 'new' consolidation; the generous judge
    passes an answer contained in the gold, the strict one only the gold itself."""

    def partition(i: dict[str, str]) -> str:
        n = int(i["message_count"])
        return chat_reply(groups=[list(range(s, min(s + groups_of, n + 1))) for s in range(1, n + 1, groups_of)])

    def narrate(i: dict[str, str]) -> str:
        lines = i["messages"].splitlines()
        first = lines[0]
        return chat_reply(cue=f"Conversation starting {first[:60]}", narrative=" ".join(lines))

    def distill(i: dict[str, str]) -> str:
        msgs = i.get("episode_messages", "").splitlines()
        return chat_reply(insights=[m.split("] ", 1)[-1] for m in msgs[:2]])

    return {
        "PartitionMessages": partition,
        "NarrateEpisode": narrate,
        "SelectContinuation": lambda i: chat_reply(choice=-1),
        "IntegrateEpisodes": lambda i: chat_reply(cue="merged", narrative="merged narrative"),
        "AnticipateEpisode": lambda i: chat_reply(predicted_episode="They talked."),
        "DistillPredictionError": distill,
        "DistillDirect": distill,
        "ConsolidateKnowledge": lambda i: chat_reply(action="new", targets=[], merged_text=""),
        "AnswerQuestion": lambda i: chat_reply(answer="7 May 2023" if i.get("context") else "I don't know"),
        "JudgeAnswer": lambda i: chat_reply(reasoning="same date", label="CORRECT"
                                            if i["generated_answer"].lower() in i["gold_answer"].lower()
                                            else "WRONG"),
        "JudgeAnswerStrict": strict_judge,
    }


def strict_judge(i: dict[str, str]) -> str:
    """Scripted strict judge: key facts present only when the answer equals the gold (case-insensitive)."""
    same = i["generated_answer"].strip().lower() == i["gold_answer"].strip().lower()
    return chat_reply(key_facts_present=same, contradicts_gold=not same, label="CORRECT" if same else "WRONG")


class LongMemEvalLM(ScriptedLM):
    """ScriptedLM that also routes the five LongMemEval judge prompts (checked before the field routes:
    three of them share their fields, so they are told apart by a phrase of their instruction)."""

    LME_ROUTES = {
        "JudgeLongMemEvalDefault": "answers a memory question correctly",
        "JudgeLongMemEvalTemporal": "answers a temporal-reasoning question correctly",
        "JudgeLongMemEvalKnowledgeUpdate": "gives the up-to-date answer",
        "JudgeLongMemEvalPreference": "personalised as a rubric describes",
        "JudgeLongMemEvalAbstention": "identifies an unanswerable question as unanswerable",
    }

    def route(self, system: str) -> str:
        hits = [name for name, phrase in self.LME_ROUTES.items() if phrase in system]
        if hits:
            assert len(hits) == 1, f"ambiguous route: {hits}"
            return hits[0]
        return super().route(system)
