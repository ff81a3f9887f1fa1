"""Signatures of Semantic Knowledge Distillation (§3.3): P_ant, P_dis, P_con, and Nemori-s.

The paper gives only the headings of its prompts (Appendix D.1.5-D.1.7, D.2); these
instructions are our reconstruction from its description of each prompt.
"""

from __future__ import annotations

import re
from typing import Any

import dspy
from pydantic import BaseModel, Field

__all__ = ["AnticipateEpisode", "DistillPredictionError", "ConsolidateKnowledge", "DistillDirect",
           "ConsolidationAction", "ConsolidationDecision", "ConsolidateKnowledgeBatch", "UpdateSummary"]

_LEADING_ACTION = re.compile(r"\s*[\"'`]?\s*(new|merge|conflict)\b", re.IGNORECASE)


def _leading_action(value: Any) -> Any:
    """Repair a reply whose action word is followed by chatter (small models echo the format note,
    e.g. ``"new   # note: the value you produce must ..."``): keep the leading keyword. Anything that
    does not *start* with new/merge/conflict is left for pydantic to reject (and the stage to retry)."""
    if isinstance(value, str):
        m = _LEADING_ACTION.match(value)
        if m:
            return m.group(1).lower()
    return value


class ConsolidationAction(str):
    """P_con's decision: ``"new"`` | ``"merge"`` | ``"conflict"`` (a plain ``str`` once parsed).

    A ``str`` subclass with its own pydantic schema (the Literal plus ``_leading_action`` before it)
    rather than ``Annotated[Literal[...], ...]``: pydantic moves Annotated metadata off a field's
    annotation, DSPy parses replies with the annotation alone, and DSPy's signature state loader only
    accepts classes. JSON schema: ``{"enum": ["new", "merge", "conflict"], "type": "string"}``.
    """

    CHOICES = ("new", "merge", "conflict")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(
            _leading_action, core_schema.literal_schema(list(cls.CHOICES)))


class AnticipateEpisode(dspy.Signature):
    """Predict what happened in an episode from its cue and prior knowledge only (P_ant, §3.3.1, Appendix D.1.5).

    You see only a short cue of the episode and what memory already knows about the people involved.
    Write your best guess of the episode's content: what was said, done, felt and planned. Use only
    the known facts and the cue; where they say nothing, guess generically."""

    episode_cue: str = dspy.InputField(desc="episodic cue: a one-line summary of the episode, with its date")
    known_facts: list[str] = dspy.InputField(desc="semantic memory entries evoked for this episode; may be empty")
    predicted_episode: str = dspy.OutputField(desc="the predicted content of the episode, 2-5 sentences")


class DistillPredictionError(dspy.Signature):
    """Extract durable knowledge from what the prediction missed (P_dis, §3.3.2, Appendix D.1.6).

    Compare the real episode with the predicted one. Keep only information in the real messages that the
    prediction got wrong or did not contain: facts about the people (identity, relationships, events with
    absolute dates, preferences, plans, possessions, opinions, skills). Cover both speakers: what each one says
    about their own life, feelings, habits and plans, with the details they give (names, numbers, reasons), and
    credit each fact to the person it is about, not to the one who asks or replies. Each insight is one
    self-contained sentence naming the person, with absolute dates (resolve "yesterday", "last week" from the
    timestamps).
    Return an empty list if the prediction already covered everything."""

    # the prediction first, the messages right before the reply: with the prediction last, the 1.5B distiller
    # returned the prediction's sentences (docs/decisions.md, "P_dis reads the messages last")
    predicted_episode: str = dspy.InputField(desc="what memory predicted the episode would contain")
    episode_messages: str = dspy.InputField(desc="the real episode: messages 'speaker: text', each dated by "
                                           "the '[YYYY-MM-DD HH:MM]' on its line or the nearest one above it")
    insights: list[str] = dspy.OutputField(desc="new or corrected facts, one self-contained sentence each")


class ConsolidateKnowledge(dspy.Signature):
    """Decide how a new insight enters semantic memory (P_con, §3.3.3, Appendix D.1.7).

    Compare the new insight with the numbered existing entries.
    - new: it adds information none of them holds.
    - merge: it complements or refines some entries about the same subject; give their numbers and
      one merged statement keeping every detail of both.
    - conflict: it contradicts or updates some entries (newer information wins); give their numbers.
    """

    insight: str = dspy.InputField(desc="the new insight, one sentence")
    existing_entries: str = dspy.InputField(desc="numbered similar entries '[i] text'; may say '(none)'")
    action: ConsolidationAction = dspy.OutputField(desc="new, merge or conflict")
    targets: list[int] = dspy.OutputField(desc="numbers of the affected existing entries; [] for new")
    merged_text: str = dspy.OutputField(desc="for merge: the unified statement; otherwise empty")


class ConsolidationDecision(BaseModel):
    """One insight's P_con decision inside a batched reply (``ConsolidateKnowledgeBatch``)."""

    insight: int = Field(description="number of the insight this decision is for (1-based)")
    action: ConsolidationAction = Field(description="new, merge or conflict")
    targets: list[int] = Field(default_factory=list,
                               description="numbers of the affected entries listed under this insight; [] for new")
    merged_text: str = Field(default="", description="for merge: the unified statement; otherwise empty")


class ConsolidateKnowledgeBatch(dspy.Signature):
    """Decide how each new insight of one episode enters semantic memory (P_con batched, §3.3.3, Appendix D.1.7).

    Each numbered insight is listed with its own numbered similar existing entries. For each insight,
    compare it only with the entries listed under it and decide:
    - new: it adds information none of them holds.
    - merge: it complements or refines some entries about the same subject; give their numbers and
      one merged statement keeping every detail of both.
    - conflict: it contradicts or updates some entries (newer information wins); give their numbers.
    Return exactly one decision per insight, in the order of the insights.
    """

    insights_with_entries: str = dspy.InputField(
        desc="numbered insights, each followed by its own numbered entries: 'Insight q: text' then '  [i] text' lines")
    insight_count: int = dspy.InputField(desc="how many insights there are; decisions run 1..insight_count")
    decisions: list[ConsolidationDecision] = dspy.OutputField(
        desc="one decision per insight, in order; targets number the entries under that insight")


class DistillDirect(dspy.Signature):
    """Extract durable knowledge from an episode directly, without prediction (Nemori-s ablation, Appendix D.2).

    List facts about the people in the messages (identity, relationships, events with absolute dates,
    preferences, plans, possessions, opinions, skills), one self-contained sentence each, naming the
    person, with relative dates resolved from the timestamps."""

    episode_messages: str = dspy.InputField(desc="the episode: messages 'speaker: text', each dated by the "
                                           "'[YYYY-MM-DD HH:MM]' on its line or the nearest one above it")
    insights: list[str] = dspy.OutputField(desc="facts, one self-contained sentence each")


class UpdateSummary(dspy.Signature):
    """Merge new insights into the running summary of what is known about the people (P_sum, flat
    summarization management, Appendix A.1).

    Rewrite the summary so that it keeps every fact it already states and adds each new insight. Where an
    insight updates or contradicts the summary, keep the newer information and its date. Keep names and
    absolute dates; write plain sentences grouped by person; do not invent anything."""

    summary: str = dspy.InputField(desc="the current summary of semantic memory; may be empty")
    new_insights: list[str] = dspy.InputField(desc="facts distilled from the latest episode, one sentence each")
    updated_summary: str = dspy.OutputField(desc="the whole rewritten summary, every earlier fact kept")
