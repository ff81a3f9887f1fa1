"""Scripted LMs: a real ``dspy.LM`` whose replies come from Python functions, one per signature, so
a Memory (or the eval, or an optimizer) runs end to end with no network and no model.

Why this lives in the package and not in ``tests/``: the fault-injection benchmark
(``python -m benchmarks.fault_injection``) drives the pipeline with it too, and ``benchmarks/`` must not
import the test suite (tests are not an importable library; the benchmark should run from any checkout
or installed copy). The package is the one place both can import; users can also script their own
pipeline tests with it. ``tests/fakes.py`` re-exports everything here for the test suite.

Replies are parsed by the real DSPy adapters (ChatAdapter by default), through the real ``dspy.LM``
call path with a custom engine (so caching, retries and history behave as in production).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Callable

import dspy
from dspy.lm15 import Message as LMMessage
from dspy.lm15 import Response, TextPart, Usage

from .insight_rules import message_lines
from .usage import UsageTrackingMixin

__all__ = [
    "ROUTES",
    "Responder",
    "ScriptedLM",
    "chat_reply",
    "default_responders",
    "field_key",
    "parse_inputs",
    "prompt_hash",
    "replay_responders",
    "signature_fields",
]


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
    from .signatures import SIGNATURES

    out: dict[tuple, str] = {}
    for name, sig in SIGNATURES.items():
        if name.startswith("judge_lme_"):
            continue  # the LongMemEval judges share fields; tests that need them route on top of this
        key = field_key(list(sig.input_fields), list(sig.output_fields))
        if key in out:  # the scripted LM could not tell them apart
            raise AssertionError(f"two signatures with the same fields: {out[key]} and {sig.__name__}")
        out[key] = sig.__name__
    return out


#: field key → signature class name (see ``_routes``), plus DSPy's own optimizer signatures.
ROUTES = {**_routes(),
          field_key(["current_instruction", "examples_with_feedback"], ["new_instruction"]): "GEPAProposeInstruction"}


#: output fields of the step signature ``dspy.ReAct`` builds at run time (it has no fixed class name).
_REACT_STEP = ("next_thought", "next_tool_name", "next_tool_args")


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
        if key is not None and key[1] == _REACT_STEP:  # dspy.ReAct's generated step signature
            return "ReAct"
        if key is not None and "trajectory" in key[0]:  # ReAct's extract step (tests/test_tools.py's agent)
            return "MemoryAgent"
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
    quote the messages, no merges, one insight per message line (``<speaker> said: <text>``, no question
    mark: a statement naming its speaker, as ``insight_rules`` keeps), 'new' consolidation; the generous judge
    passes an answer contained in the gold, the strict one only the gold itself."""

    def partition(i: dict[str, str]) -> str:
        n = int(i["message_count"])
        return chat_reply(groups=[list(range(s, min(s + groups_of, n + 1))) for s in range(1, n + 1, groups_of)])

    def narrate(i: dict[str, str]) -> str:
        lines = i["messages"].splitlines()
        first = lines[0]
        return chat_reply(cue=f"Conversation starting {first[:60]}", narrative=" ".join(lines))

    def distill(i: dict[str, str]) -> str:  # "<speaker> said: <text>" of the first two lines, as statements
        msgs = message_lines(i.get("episode_messages", ""))
        return chat_reply(insights=[f"{who} said: {text}".rstrip("?") for who, text in msgs[:2]])

    def narrate_batch(i: dict[str, str]) -> str:  # each group as ``narrate`` would narrate it alone
        groups = re.split(r"^Group \d+:\n", i["message_groups"], flags=re.M)[1:]
        return chat_reply(episodes=[{"group": g, "cue": f"Conversation starting {lines.splitlines()[0][:60]}",
                                     "narrative": " ".join(lines.splitlines())} for g, lines in enumerate(groups, 1)])

    def consolidate_batch(i: dict[str, str]) -> str:
        n = int(i["insight_count"])
        return chat_reply(decisions=[{"insight": q, "action": "new", "targets": [], "merged_text": ""}
                                     for q in range(1, n + 1)])

    return {
        "PartitionMessages": partition,
        "NarrateEpisode": narrate,
        "SelectContinuation": lambda i: chat_reply(choice=-1),
        "IntegrateEpisodes": lambda i: chat_reply(cue="merged", narrative="merged narrative"),
        "AnticipateEpisode": lambda i: chat_reply(predicted_episode="They talked."),
        "DistillPredictionError": distill,
        "DistillDirect": distill,
        "ConsolidateKnowledge": lambda i: chat_reply(action="new", targets=[], merged_text=""),
        "NarrateEpisodes": narrate_batch,
        "ConsolidateKnowledgeBatch": consolidate_batch,
        "UpdateSummary": lambda i: chat_reply(updated_summary="\n".join(
            [i.get("summary", ""), *json.loads(i.get("new_insights") or "[]")]).strip()),
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


def replay_responders() -> dict[str, Responder]:
    """``default_responders()`` with partition, continuation and consolidation replies that depend only on
    the prompt (``prompt_hash``): uneven groups of 3-6, continue/new choices, new|merge|conflict actions.

    A rerun of the same work (a replay after a crash, a retry after an injected fault) gets the same reply,
    while the run as a whole still exercises merges and conflicts.
    """
    base = default_responders()

    def partition(i: dict[str, str]) -> str:
        n, h = int(i["message_count"]), prompt_hash(i)
        size = 3 + h % 4
        return chat_reply(groups=[list(range(s, min(s + size, n + 1))) for s in range(1, n + 1, size)])

    def select(i: dict[str, str]) -> str:
        return chat_reply(choice=[-1, 1, -1][prompt_hash(i) % 3])

    def consolidate(i: dict[str, str]) -> str:
        h = prompt_hash(i)
        action = ["new", "merge", "conflict", "new"][h % 4]
        return chat_reply(action=action, targets=[1] if action != "new" else [], merged_text=f"merged fact {h % 97}")

    def consolidate_batch(i: dict[str, str]) -> str:
        h, n = prompt_hash(i), int(i["insight_count"])
        actions = [["new", "merge", "conflict", "new"][(h + q) % 4] for q in range(n)]
        return chat_reply(decisions=[{"insight": q, "action": a, "targets": [1] if a != "new" else [],
                                      "merged_text": f"merged fact {(h + q) % 97}"} for q, a in enumerate(actions, 1)])

    base.update(PartitionMessages=partition, SelectContinuation=select, ConsolidateKnowledge=consolidate,
                ConsolidateKnowledgeBatch=consolidate_batch)
    return base
