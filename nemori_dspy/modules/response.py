"""Response generation (§3.4): retrieve top-k episodes, top-m semantic entries, raw messages of
the top-r episodes, then P_ans. ``use_memory=False`` is the no-memory control (empty context)."""

from __future__ import annotations

import time
from typing import Callable, Collection

import dspy

from ..formatting import render_context
from ..types import SearchResult
from .resources import Resources

__all__ = ["ResponseGeneration"]


class ResponseGeneration(dspy.Module):
    """``forward(user_id, question, use_memory=True)`` → ``dspy.Prediction(answer, context, retrieved, search_ms)``.

    Defaults k = 10, m = 2k = 20, r = 2 (§4.1). ``search_ms`` is retrieval wall time in milliseconds.
    ``include_episodes``/``include_semantic``/``include_raw`` switch context parts off for the
    paper's ablations (w/o e, w/o s, w/o p; §4.4).
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module], include_episodes: bool = True,
                 include_semantic: bool = True, include_raw: bool = True) -> None:
        super().__init__()
        self.res = resources
        self.answer = make("answer")
        self.include_episodes, self.include_semantic, self.include_raw = include_episodes, include_semantic, include_raw

    def retrieve(self, user_id: str, query: str, top_k: int | None = None, semantic_top_k: int | None = None,
                 only: Collection[str] | None = None, sources: Collection[str] | None = None) -> SearchResult:
        """Both searches by the query embedding, each ordered by decreasing cosine (§3.4).

        ``only`` restricts episodes to those ids, ``sources`` semantic entries to those with a source
        episode among them (the ``Memory.search`` metadata filter)."""
        s = self.res.settings
        vec = self.res.embed(query)
        k = s.episodes_top_k if top_k is None else top_k
        m = s.semantic_top_k if semantic_top_k is None else semantic_top_k
        ep_kw = {} if only is None else {"only": only}
        sem_kw = {} if sources is None else {"sources": sources}
        return SearchResult(
            episodes=self.res.store.search_episodes(user_id, vec, k, **ep_kw) if self.include_episodes else [],
            semantic=self.res.store.search_semantic(user_id, vec, m, **sem_kw) if self.include_semantic else [])

    def forward(self, user_id: str, question: str, use_memory: bool = True) -> dspy.Prediction:
        t0 = time.perf_counter()
        retrieved = self.retrieve(user_id, question) if use_memory else SearchResult()
        search_ms = (time.perf_counter() - t0) * 1000
        r = self.res.settings.raw_episodes_top_r if self.include_raw else 0
        s = self.res.settings
        context = render_context(retrieved, r, s.max_message_chars, s.max_prompt_chars, s.resolve_relative_dates)
        pred = self.answer(context=context, question=question)
        return dspy.Prediction(answer=str(pred.answer).strip(), context=context, retrieved=retrieved,
                               search_ms=search_ms)
