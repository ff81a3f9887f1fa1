"""Response generation (§3.4): retrieve top-k episodes, top-m semantic entries, raw messages of
the top-r episodes, then P_ans. ``use_memory=False`` is the no-memory control (empty context)."""

from __future__ import annotations

import time
from typing import Callable, Collection

import dspy

from ..formatting import CHRONOLOGICAL_FACTS_HEADER, CONTEXT_HEADERS, chronological_facts, fit_context, render_context
from ..usage import tally
from ..types import SearchResult
from .resources import Resources

__all__ = ["ResponseGeneration"]


class ResponseGeneration(dspy.Module):
    """``forward(user_id, question, use_memory=True)`` → ``dspy.Prediction(answer, context, retrieved, search_ms)``.

    Defaults k = 10, m = 2k = 20, r = 2 (§4.1). ``search_ms`` is retrieval wall time in milliseconds.
    ``context(..., include_episodes/include_semantic/include_raw=False)`` switches context parts off for
    one call, for the paper's ablations (w/o e, w/o s, w/o p; §4.4).
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module]) -> None:
        super().__init__()
        self.res = resources
        self.answer = make("answer")

    def retrieve(self, user_id: str, query: str, top_k: int | None = None, semantic_top_k: int | None = None,
                 only: Collection[str] | None = None, sources: Collection[str] | None = None) -> SearchResult:
        """Both searches by the query embedding in one store call (§3.4), each ordered by decreasing
        cosine, or with ``lexical_weight`` > 0 by cosine fused with the lexical match of ``query``.

        ``only`` restricts episodes to those ids, ``sources`` semantic entries to those with a source
        episode among them (the ``Memory.search`` metadata filter)."""
        s = self.res.settings
        vec = self.res.embed(query)
        k = s.episodes_top_k if top_k is None else top_k
        m = s.semantic_top_k if semantic_top_k is None else semantic_top_k
        if not k and not m:
            return SearchResult()
        return self.res.store.search(user_id, vec, k, m, query=query, only=only, sources=sources)

    def context(self, user_id: str, question: str, use_memory: bool = True, include_episodes: bool = True,
                include_semantic: bool = True, include_raw: bool = True) -> dspy.Prediction:
        """The answer context P_ans sees for ``question``: the one code path for ``Memory.answer``, the eval
        harness and the optimizers (so what is tuned is exactly what runs).

        ``include_*=False`` leaves that part out of this call's context (the eval's ablation systems): no
        episode search, no semantic search, no raw messages.
        With ``answer_context_tokens`` set, ``retrieved`` holds only what fit the cap (``formatting.fit_context``), so
        evidence recall is measured on what P_ans actually sees.

        Returns:
            ``dspy.Prediction(context=str, retrieved=SearchResult, search_ms=float)``; ``context`` is "" when
            nothing was retrieved or ``use_memory`` is False; ``search_ms`` is retrieval wall time (ms).
        """
        eps, sem, raw = include_episodes, include_semantic, include_raw
        t0 = time.perf_counter()
        retrieved = SearchResult()
        if use_memory:
            s = self.res.settings
            retrieved = self.retrieve(user_id, question, s.episodes_top_k if eps else 0,
                                      s.semantic_top_k if sem else 0)
        search_ms = (time.perf_counter() - t0) * 1000
        s = self.res.settings
        r = s.raw_episodes_top_r if raw else 0
        raw_ids = None
        if s.answer_context_tokens is not None and (retrieved.episodes or retrieved.semantic):
            n = len(retrieved.episodes) + len(retrieved.semantic)
            retrieved, raw_ids = fit_context(retrieved, r, s.answer_context_tokens, max_chars=s.max_message_chars,
                                             resolve_dates=s.resolve_relative_dates, timestamps=s.message_timestamps)
            dropped = n - len(retrieved.episodes) - len(retrieved.semantic)
            if dropped:
                tally("answer_context_items_dropped", dropped)
        header = CONTEXT_HEADERS[2]
        if s.facts_order == "chronological" and retrieved.semantic:
            retrieved, header = chronological_facts(retrieved, s.naive_timezone), CHRONOLOGICAL_FACTS_HEADER
        context = render_context(retrieved, r, s.max_message_chars, s.max_prompt_chars, s.resolve_relative_dates,
                                 raw_ids, s.message_timestamps, facts_header=header)
        return dspy.Prediction(context=context, retrieved=retrieved, search_ms=search_ms)

    def forward(self, user_id: str, question: str, use_memory: bool = True,
                context: str | None = None) -> dspy.Prediction:
        """Retrieve the context (``context``), then P_ans; the answer is stripped of surrounding whitespace.

        ``context`` given: P_ans answers on that text and nothing is retrieved (``retrieved`` empty,
        ``search_ms`` 0), for callers that build the context another way (the eval's ablation, full-context
        and RAG systems)."""
        if context is None:
            ctx = self.context(user_id, question, use_memory)
        else:
            ctx = dspy.Prediction(context=context, retrieved=SearchResult(), search_ms=0.0)
        pred = self.answer(context=ctx.context, question=question)
        return dspy.Prediction(answer=str(pred.answer).strip(), context=ctx.context, retrieved=ctx.retrieved,
                               search_ms=ctx.search_ms)
