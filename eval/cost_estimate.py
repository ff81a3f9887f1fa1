"""What an eval will cost, estimated before it runs (``eval locomo`` prints it when a model it calls is priced).

Prices come from litellm's model cost map (``litellm.cost_per_token``). A model the map does not know, or prices at
$0 — the embedded llama.cpp server (``openai/local``), any ``openai/<name>`` at an ``api_base``, Ollama — is
*unpriced*: its phase is listed without dollars, and a run where every model is unpriced prints one line saying so.

Tokens are estimated, not measured:

* **construction**, for the conversations this run builds (reused memory costs nothing): calls and tokens per 100
  turns per stage as measured on 327 LoCoMo turns with the default configuration (the paper configuration's rates
  for a system with ``PAPER_CONSTRUCTION``), ``CONSTRUCTION_OUTPUT_SHARE`` of them output;
* **answer**, per question not yet answered and system: the answer prompt as the adapter renders it (instruction,
  field labels, demos), the question, and the context the system gives (the ``answer_context_tokens`` cap for
  memory systems, ``PAPER_CONTEXT_TOKENS`` when uncut; the conversation up to the baseline budget for
  ``full-context``; the budget for ``rag-4096``; nothing for ``no-memory``), ``ANSWER_OUTPUT_TOKENS`` out;
* **judge**, per answer and judge: the judge prompt with the question, the gold and an answer of
  ``ANSWER_OUTPUT_TOKENS``, ``JUDGE_OUTPUT_TOKENS`` out; plus the audit's two calls per pair.

Tokens are counted with litellm's default tokenizer (as ``context_tokens`` is). DSPy's response cache makes a
repeated call free, so a rerun costs less than estimated; embedding calls are not included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, Field

from nemori_dspy.errors import DatasetError
from nemori_dspy.stages import CONSTRUCTION_STAGES
from nemori_dspy.eval.baselines import CHARS_PER_TOKEN, context_budget_chars, render_turn
from nemori_dspy.eval.locomo import LoCoMoConversation, stratified_questions
from nemori_dspy.eval.systems import PAPER_CONSTRUCTION, System

__all__ = ["PhaseEstimate", "CostEstimate", "price", "estimate_locomo_cost", "CONSTRUCTION_PER_100_TURNS",
           "RATES_PATH",
           "CONSTRUCTION_OUTPUT_SHARE", "ANSWER_OUTPUT_TOKENS", "JUDGE_OUTPUT_TOKENS", "PAPER_CONTEXT_TOKENS"]

#: the measured rates behind CONSTRUCTION_PER_100_TURNS (data, so no stage list is kept in code).
RATES_PATH = Path(__file__).with_name("construction_rates.json")


def _load_rates(path: Path = RATES_PATH) -> dict[str, dict[str, tuple[float, float]]]:
    """(calls, input + output tokens) per 100 turns per construction stage, for ``"default"`` and ``"paper"``.

    Raises:
        DatasetError: a stage in the file is not a construction stage of ``nemori_dspy.stages``.
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = {cfg: {stage: (float(c), float(t)) for stage, (c, t) in raw[cfg].items()} for cfg in ("default", "paper")}
    unknown = {stage for rates in out.values() for stage in rates} - set(CONSTRUCTION_STAGES)
    if unknown:
        raise DatasetError(f"{path}: {sorted(unknown)} are no construction stages. Fix: use the names of "
                           "nemori_dspy.stages.CONSTRUCTION_STAGES.")
    return out


#: (calls, input + output tokens) per 100 turns per construction stage, measured on LoCoMo conv-26/30/41/42/43,
#: sessions 1-3 (327 turns; ``benchmarks/results/construction-local_0.5b-20261201-220155.json``), for the
#: default configuration and for the paper's (``nemori-paper``); read from ``RATES_PATH``.
CONSTRUCTION_PER_100_TURNS: dict[str, dict[str, tuple[float, float]]] = _load_rates()
#: share of a construction stage's tokens that are output (narratives, insights, decisions): a rough figure; the
#: local runs on record wrote 6-8 % of all their tokens (docs/measurements.md).
CONSTRUCTION_OUTPUT_SHARE = 0.10
#: tokens of a typical answer (LoCoMo answers are a phrase; the answer stage's cap is higher).
ANSWER_OUTPUT_TOKENS = 24
#: tokens of a typical verdict (a line of reasoning and the label).
JUDGE_OUTPUT_TOKENS = 64
#: answer context of a memory system without a token cap: the mean measured for the paper configuration
#: (2,645 tokens, same result file).
PAPER_CONTEXT_TOKENS = 2650


class PhaseEstimate(BaseModel):
    """One phase (a construction stage, ``answer``, ``judge``) on one model."""

    phase: str = Field(description="'construction: <stage>', 'answer' or 'judge'")
    model: str = Field(description="litellm model string that runs it")
    calls: int = Field(description="LLM calls expected")
    input_tokens: int = Field(description="input tokens expected")
    output_tokens: int = Field(description="output tokens expected")
    cost_usd: float | None = Field(description="dollars at litellm's price; None when the model is unpriced")


class CostEstimate(BaseModel):
    """The phases of a run and what they cost; ``text()`` is what the eval prints."""

    phases: list[PhaseEstimate] = Field(default_factory=list)
    turns_to_build: int = Field(0, description="turns whose memory the run builds")
    answers: int = Field(0, description="answers the run asks for (questions × systems, minus those resumed)")

    @property
    def priced(self) -> bool:
        """True if any phase is priced."""
        return any(p.cost_usd is not None for p in self.phases)

    @property
    def total_usd(self) -> float:
        """Dollars of the priced phases."""
        return sum(p.cost_usd or 0.0 for p in self.phases)

    def text(self) -> str:
        """The estimate as printed: a table of phases with the total, or one line when nothing is priced."""
        unpriced = sorted({p.model for p in self.phases if p.cost_usd is None})
        if not self.priced:
            return f"cost estimate: unpriced ({', '.join(unpriced) or 'no LLM calls'}: not in litellm's price table)"
        head = f"{'phase':<26}{'model':<28}{'calls':>8}{'in tokens':>12}{'out tokens':>12}{'$':>10}"
        lines = [f"cost estimate before the run ({self.turns_to_build:,} turns to build, {self.answers:,} answers; "
                 "litellm prices; rough, DSPy cache hits cost nothing):", head, "-" * len(head)]
        for p in self.phases:
            money = "unpriced" if p.cost_usd is None else _dollars(p.cost_usd)
            lines.append(f"{p.phase:<26}{p.model[:27]:<28}{p.calls:>8,}{p.input_tokens:>12,}{p.output_tokens:>12,}"
                         f"{money:>10}")
        note = f" (unpriced: {', '.join(unpriced)})" if unpriced else ""
        lines.append(f"{'total':<26}{'':<28}{sum(p.calls for p in self.phases):>8,}"
                     f"{sum(p.input_tokens for p in self.phases):>12,}{sum(p.output_tokens for p in self.phases):>12,}"
                     f"{_dollars(self.total_usd):>10}{note}")
        return "\n".join(lines)


def _dollars(usd: float) -> str:
    return f"{usd:.2f}" if usd >= 1 else f"{usd:.4f}"


def price(model: str, input_tokens: int, output_tokens: int) -> float | None:
    """Dollars for these tokens at litellm's price of ``model``; None when litellm does not price it (or prices it
    at $0, as it does local servers such as Ollama)."""
    import litellm

    try:
        cost_in, cost_out = litellm.cost_per_token(model=model, prompt_tokens=input_tokens,
                                                   completion_tokens=output_tokens)
    except (litellm.exceptions.ModelNotMappedError, ValueError, KeyError):
        return None
    total = float(cost_in) + float(cost_out)
    return total if total > 0 else None


def _tokens(text: str) -> int:
    import litellm

    return litellm.token_counter(text=text) if text else 0


def _prompt_tokens(predictor: Any, adapter: Any, inputs: dict[str, str]) -> int:
    """Tokens of the prompt ``adapter`` renders for ``predictor`` (a ``StagePredict`` or a DSPy predictor; its
    instruction, fields and demos) with ``inputs`` (the input fields not given are empty)."""
    import litellm

    inner = next(p for _, p in predictor.named_predictors())
    values = {name: inputs.get(name, "") for name in inner.signature.input_fields}
    messages = adapter.format(inner.signature, list(inner.demos or []), values)
    return litellm.token_counter(messages=messages)


def _model(lm: Any) -> str:
    return str(getattr(lm, "model", lm))


def _phase(phase: str, model: str, calls: int, inp: int, out: int) -> PhaseEstimate:
    return PhaseEstimate(phase=phase, model=model, calls=calls, input_tokens=inp, output_tokens=out,
                         cost_usd=price(model, inp, out) if calls else None)


def _construction(to_build: dict[str, tuple[System, int]], rt: Any) -> list[PhaseEstimate]:
    """Per stage (and model): the measured rates × turns of each construction this run builds."""
    sums: dict[tuple[str, str], list[float]] = {}
    for system, turns in to_build.values():
        rates = CONSTRUCTION_PER_100_TURNS["paper" if system.construction == PAPER_CONSTRUCTION else "default"]
        for stage, (calls, tokens) in rates.items():
            key = (stage, _model(rt.stage_lms.get(stage, rt.lm)))
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += calls * turns / 100
            acc[1] += tokens * turns / 100
    out = []
    for (stage, model), (calls, tokens) in sums.items():
        out_tokens = int(tokens * CONSTRUCTION_OUTPUT_SHARE)
        out.append(_phase(f"construction: {stage}", model, round(calls), int(tokens) - out_tokens, out_tokens))
    return out


def _context_tokens(system: System, settings: Any, conv_tokens: int) -> int:
    budget = context_budget_chars(settings.n_ctx) // CHARS_PER_TOKEN
    if system.context == "memory":
        cap = system.answer.get("answer_context_tokens", settings.answer_context_tokens)
        return cap if cap is not None else PAPER_CONTEXT_TOKENS
    if system.context == "full":
        return min(conv_tokens, budget)
    if system.context == "rag":
        return budget
    return 0


def estimate_locomo_cost(conversations: list[LoCoMoConversation], systems: list[System], categories: Iterable[int],
                         max_questions: int | None, rt: Any, pipeline: Any, is_built: Any,
                         done: set[tuple[str, str, Any]], judges: list[str], audit_pairs: int) -> CostEstimate:
    """The estimate of a LoCoMo run (see the module docstring).

    Args:
        conversations: the run's conversations (sliced as the run slices them).
        systems, categories, max_questions: as ``EvalOptions`` has them.
        rt: the run's ``Runtime`` (``lm``, ``judge_lm``, ``stage_lms``, ``settings``): which model runs what.
        pipeline: a ``NemoriPipeline`` of the run (its answer predictor: instruction and demos as they will run).
        is_built: ``(system, sample_id) -> bool``, True for memory the run reuses (``MemoryProvider.is_built``).
        done: keys ``(system, sample_id, index)`` already answered (``--resume``).
        judges: the judge panel's metric names (``judge``, ``judge_strict``); [] without a judge.
        audit_pairs: calibration pairs of the judge audit (two judge calls each per judge).
    """
    from nemori_dspy.adapters import make_adapter
    from nemori_dspy.eval.judge import LLMJudge
    from nemori_dspy.modules.pipeline import pipeline_stage

    settings = rt.settings
    adapter = make_adapter(settings.adapter)
    conv_tokens = {c.sample_id: _tokens("\n".join(render_turn(m) for m in c.messages)) for c in conversations}
    to_build: dict[str, tuple[System, int]] = {}
    for system in systems:
        if system.builds != "nemori":
            continue
        turns = sum(len(c.messages) for c in conversations if not is_built(system, c.sample_id))
        to_build.setdefault(system.construction_key(), (system, turns))
    answer_base = _prompt_tokens(pipeline_stage(pipeline, "answer"), adapter, {})
    judge_base = {name: _prompt_tokens(LLMJudge(rt.judge_lm, strict=name == "judge_strict").predict, adapter, {})
                  for name in judges}
    answers = answer_in = judge_in = 0
    for conv in conversations:
        for q in stratified_questions([q for q in conv.questions if q.category in set(categories)], max_questions):
            q_tokens, gold_tokens = _tokens(q.question), _tokens(q.answer)
            for system in systems:
                if (system.name, q.sample_id, q.index) in done:
                    continue
                answers += 1
                answer_in += answer_base + q_tokens + _context_tokens(system, settings, conv_tokens[conv.sample_id])
                judge_in += q_tokens + gold_tokens + ANSWER_OUTPUT_TOKENS
    answer_model = _model(rt.stage_lms.get("answer", rt.lm))
    phases = _construction(to_build, rt)
    phases.append(_phase("answer", answer_model, answers, answer_in, answers * ANSWER_OUTPUT_TOKENS))
    for name, base in judge_base.items():
        calls = answers + 2 * audit_pairs
        avg_extra = judge_in / answers if answers else 0
        phases.append(_phase(name, _model(rt.judge_lm), calls, int(calls * (base + avg_extra)),
                             calls * JUDGE_OUTPUT_TOKENS))
    return CostEstimate(phases=[p for p in phases if p.calls], turns_to_build=sum(t for _, t in to_build.values()),
                        answers=answers)
