"""Systems compared in one LoCoMo run, all sharing the answer signature (P_ans) and the scoring.

| name | memory built | answer context |
|---|---|---|
| ``nemori`` | Nemori (prediction-error distillation) | episodes + raw top-r + semantic (§3.4) |
| ``nemori-paper`` | Nemori as the paper configures it: every addition of ours off (``PAPER_FAITHFUL``) | as ``nemori``, with the paper's answer side (vector-only search, k/m/r uncut) |
| ``nemori-s`` | direct distillation (Appendix D.2) | semantic only (Table 5) |
| ``nemori-no-episodic`` | Nemori | semantic only (w/o e) |
| ``nemori-no-semantic`` | Nemori | episodes + raw (w/o s) |
| ``nemori-no-raw`` | Nemori | episodes + semantic (w/o p) |
| ``nemori-no-consolidation`` | Nemori, insights appended without P_con (App. A.2) | as ``nemori`` |
| ``nemori-flat`` | Nemori episodes, semantic memory one running summary rewritten by P_sum (App. A.1) | episodes + raw + the summary |
| ``full-context`` | none | the whole conversation (most recent turns kept if it does not fit) |
| ``rag-4096`` | 4,096-token chunks of the raw dialogue, same embedder | top chunk(s) by cosine |
| ``no-memory`` | none | empty (control) |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from nemori_dspy.config import PAPER_FAITHFUL
from nemori_dspy.errors import ConfigError

__all__ = ["System", "SYSTEMS", "parse_systems", "ANSWER_SIDE", "PAPER_CONSTRUCTION", "PAPER_ANSWER"]

#: Settings read only when answering (retrieval and the answer context, §3.4): a system's ``answer`` overrides.
#: They never shape what construction stores, so systems differing only in them share one built memory.
ANSWER_SIDE = frozenset({"lexical_weight", "answer_context_tokens", "episodes_top_k", "semantic_top_k", "facts_order",
                         "raw_episodes_top_r"})
#: ``nemori-paper``'s construction overrides: every method setting of ``PAPER_FAITHFUL`` but the answer side and
#: the server's prompt cache (a runtime flag; it does not change a reply).
PAPER_CONSTRUCTION = {k: v for k, v in PAPER_FAITHFUL.items() if k not in ANSWER_SIDE and k != "local_prompt_cache"}
#: ``nemori-paper``'s answer overrides: vector-only search (lexical_weight 0), the paper's k = 10, m = 20, r = 2 uncut.
PAPER_ANSWER = {k: v for k, v in PAPER_FAITHFUL.items() if k in ANSWER_SIDE}


@dataclass(frozen=True)
class System:
    """One system: what memory it builds (``construction`` overrides of NemoriSettings) and how it answers
    (``answer`` overrides of the ``ANSWER_SIDE`` settings, applied to the memory it answers from; the context parts
    it includes)."""

    name: str
    builds: Literal["nemori", "rag", "none"]
    context: Literal["memory", "full", "rag", "empty"]
    construction: dict = field(default_factory=dict)
    include_episodes: bool = True
    include_semantic: bool = True
    include_raw: bool = True
    answer: dict = field(default_factory=dict)

    def construction_key(self) -> str:
        """Systems with equal keys share one built memory."""
        return f"{self.builds}:{sorted(self.construction.items())}"


SYSTEMS: dict[str, System] = {s.name: s for s in [
    System("nemori", "nemori", "memory"),
    System("nemori-paper", "nemori", "memory", PAPER_CONSTRUCTION, answer=PAPER_ANSWER),
    System("nemori-s", "nemori", "memory", {"distillation": "direct"}, include_episodes=False, include_raw=False),
    System("nemori-no-episodic", "nemori", "memory", include_episodes=False, include_raw=False),
    System("nemori-no-semantic", "nemori", "memory", include_semantic=False),
    System("nemori-no-raw", "nemori", "memory", include_raw=False),
    System("nemori-no-consolidation", "nemori", "memory", {"consolidation": False}),
    System("nemori-flat", "nemori", "memory", {"semantic_management": "flat"}),
    System("full-context", "none", "full"),
    System("rag-4096", "rag", "rag"),
    System("no-memory", "none", "empty"),
]}


def parse_systems(spec: str) -> list[System]:
    """``"nemori,full-context"`` → systems, in the order given.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones).
    """
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ConfigError(f"unknown system(s) {unknown or spec!r}. Fix: choose from {', '.join(SYSTEMS)}.")
    return [SYSTEMS[n] for n in dict.fromkeys(names)]
