"""Flat summarization management (Appendix A.1): semantic memory is one running summary per user.

Context evocation returns the summary as constant context for P_ant; knowledge consolidation rewrites
it with the episode's insights by P_sum (``signatures.semantic.UpdateSummary``). The paper offers this
configuration "only as a conceptual illustration"; it is here so every management in the paper runs in
the harness (``--system nemori-flat``). The summary is stored as one semantic entry (``summary_id``), so
the store, the answer context (top-m semantic entries) and the tools need nothing new.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Callable

import dspy

from nemori_dspy.formatting import render_messages
from nemori_dspy.modules.resources import Resources
from nemori_dspy.insight_rules import demo_texts
from nemori_dspy.modules.semantic import clean_insights, human_messages
from nemori_dspy.types import Episode, SemanticEntry, span_union
from nemori_dspy.usage import tally

__all__ = ["FlatSummaryDistillation", "summary_id", "fallback_summary"]

log = logging.getLogger(__name__)


def summary_id(user_id: str) -> str:
    """The id of ``user_id``'s summary entry: ``"sum_"`` + sha256(user_id)[:16] (one per user)."""
    return "sum_" + hashlib.sha256(user_id.encode()).hexdigest()[:16]


def fallback_summary(summary: str, insights: list[str]) -> str:
    """The summary with ``insights`` appended one per line: what is kept when P_sum's reply is empty or
    drops earlier text wholesale (a rewrite shorter than half the old summary), so a bad reply never
    loses what memory held."""
    return "\n".join([summary.strip(), *insights]).strip()


class FlatSummaryDistillation(dspy.Module):
    """Distill one episode into the user's running summary (Appendix A.1).

    ``forward(user_id, episode)`` → ``dspy.Prediction(inserts, deletes, insights, evoked)`` with the same
    contract as ``SemanticDistillation``: ``inserts`` holds the rewritten summary entry (same id, so it
    replaces the old one on commit), ``deletes`` is always empty, ``evoked`` is ``[summary]`` or ``[]``.
    Insights come from prediction error (P_ant → P_dis, §3.3.1-3.3.2) with the summary as the known facts,
    or from direct distillation when ``settings.distillation == "direct"``. The summary's event span is
    the union of its source episodes'; it is cut to ``settings.summary_max_chars`` characters.

    Raises:
        LLMError: a stage failed after retries (the episode stays undistilled; retried next flush).
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module]) -> None:
        super().__init__()
        self.res = resources
        if resources.settings.distillation == "direct":
            self.direct_distill = make("direct_distill")
        else:
            self.anticipate = make("anticipate")
            self.distill = make("distill")
        self.summarize = make("summarize")

    def current(self, user_id: str) -> SemanticEntry | None:
        """The user's summary entry, or None before the first insight."""
        sid = summary_id(user_id)
        return next((e for e in self.res.store.list_semantic(user_id) if e.id == sid), None)

    def insights(self, episode: Episode, summary: str) -> list[str]:
        """K_in of the episode (noise removed as in ``SemanticDistillation.insights``); [] for noise only."""
        s = self.res.settings
        content = human_messages(episode.messages)
        if not content:
            tally("distill_skipped_noise_only")
            return []
        msgs = render_messages(content, s.max_message_chars, s.max_prompt_chars, s.resolve_relative_dates,
                               s.message_timestamps)
        if s.distillation == "direct":
            return clean_insights(self.direct_distill(episode_messages=msgs).insights, msgs,
                                  demos=demo_texts(self.direct_distill))
        tally("evoke_calls")
        if not summary:
            tally("evoke_empty")
        predicted = self.anticipate(episode_cue=f"({episode.start:%Y-%m-%d}) {episode.cue}",
                                    known_facts=[summary] if summary else []).predicted_episode
        return clean_insights(self.distill(episode_messages=msgs, predicted_episode=str(predicted)).insights, msgs,
                              predicted=str(predicted), demos=demo_texts(self.distill))

    def rewrite(self, summary: str, insights: list[str]) -> str:
        """P_sum(summary, insights), guarded: an empty reply, or one shorter than half the old summary, is
        replaced by ``fallback_summary`` (counted as ``summary_fallback``); cut to ``summary_max_chars``."""
        new = str(self.summarize(summary=summary, new_insights=insights).updated_summary or "").strip()
        if not new or len(new) < len(summary) / 2:
            tally("summary_fallback")
            log.info("P_sum reply %r dropped the summary; kept it with the insights appended", new[:200])
            new = fallback_summary(summary, insights)
        cap = self.res.settings.summary_max_chars
        if len(new) > cap:
            tally("summary_truncated")
            new = new[:cap]
        return new

    def forward(self, user_id: str, episode: Episode) -> dspy.Prediction:
        old = self.current(user_id)
        summary = old.text if old else ""
        found = self.insights(episode, summary)
        tally("insights", len(found))
        if not found:
            return dspy.Prediction(inserts=[], deletes=[], insights=[], evoked=[summary] if summary else [])
        text = self.rewrite(summary, found)
        spans = [(episode.start, episode.end)] + ([(old.event_start, old.event_end)] if old else [])
        start, end = span_union(spans, self.res.settings.naive_timezone)
        entry = SemanticEntry(id=summary_id(user_id), user_id=user_id, text=text, vector=self.res.embed(text),
                              source_episode_ids=sorted({episode.id, *(old.source_episode_ids if old else [])}),
                              event_start=start, event_end=end)
        return dspy.Prediction(inserts=[entry], deletes=[], insights=found, evoked=[summary] if summary else [])
