"""Signatures of Episodic Memory Integration (§3.2): P_par, P_nar, P_sel, P_int.

The paper gives only the headings of its prompts (Appendix D.1.1-D.1.4); these
instructions are our reconstruction from its description of each prompt.
"""

from __future__ import annotations

import dspy
from pydantic import BaseModel, Field

__all__ = ["PartitionMessages", "NarrateEpisode", "SelectContinuation", "IntegrateEpisodes", "NarratedEpisode",
           "NarrateEpisodes"]


class PartitionMessages(dspy.Signature):
    """Split a window of conversation messages into episodes (P_par, §3.2.1, Appendix D.1.1).

    An episode is a run of messages about one coherent topic or event; start a new episode when
    the topic, goal or scene clearly changes, or when there is a large time gap between messages.
    Return groups of message numbers: every number from 1 to message_count must appear in exactly
    one group, groups are listed in order, and numbers inside a group are ascending."""

    messages: str = dspy.InputField(desc="numbered messages, one per line '<n>. speaker: text', each dated by the "
                                  "'[YYYY-MM-DD HH:MM]' on its line or the nearest one above it")
    message_count: int = dspy.InputField(desc="how many messages there are; numbers run 1..message_count")
    groups: list[list[int]] = dspy.OutputField(
        desc="episodes as lists of message numbers, e.g. [[1, 2, 3], [4, 5]]; each number exactly once")


class NarrateEpisode(dspy.Signature):
    """Turn the messages of one episode into a narrative episodic memory (P_nar, §3.2.2, Appendix D.1.2).

    Write the cue: a short title naming who did what, and when (absolute date). Write the narrative:
    a faithful third-person account of what happened and what was said, naming the speakers, keeping
    concrete details (names, places, numbers, feelings, plans). Convert every relative time expression
    ("yesterday", "last week", "next month") into an absolute date using the message timestamps, e.g.
    a message dated 2021-03-12 saying "yesterday" means 11 March 2021. Do not invent facts."""

    messages: str = dspy.InputField(desc="the episode's messages, one per line 'speaker: text', each dated by "
                                  "the '[YYYY-MM-DD HH:MM]' on its line or the nearest one above it")
    cue: str = dspy.OutputField(desc="episodic cue: one-line title with who, what and the absolute date")
    narrative: str = dspy.OutputField(desc="third-person narrative with absolute dates, 2-6 sentences")


class NarratedEpisode(BaseModel):
    """One group's cue and narrative inside a batched P_nar reply (``NarrateEpisodes``)."""

    group: int = Field(description="number of the group this episode narrates (1-based)")
    cue: str = Field(description="episodic cue: one-line title with who, what and the absolute date")
    narrative: str = Field(description="third-person narrative with absolute dates, 2-6 sentences")


class NarrateEpisodes(dspy.Signature):
    """Turn each numbered group of messages into its own narrative episodic memory (P_nar batched, §3.2.2,
    Appendix D.1.2).

    For every group write the cue: a short title naming who did what, and when (absolute date), and the
    narrative: a faithful third-person account of what happened and what was said in that group only,
    naming the speakers, keeping concrete details (names, places, numbers, feelings, plans). Convert every
    relative time expression ("yesterday", "last week", "next month") into an absolute date using the
    message timestamps, e.g. a message dated 2021-03-12 saying "yesterday" means 11 March 2021. Do not
    invent facts. Return exactly one episode per group, in the order of the groups."""

    message_groups: str = dspy.InputField(
        desc="numbered groups: a 'Group g:' line, then its messages 'speaker: text', each dated by the "
        "'[YYYY-MM-DD HH:MM]' on its line or the nearest one above it")
    group_count: int = dspy.InputField(desc="how many groups there are; episodes run 1..group_count")
    episodes: list[NarratedEpisode] = dspy.OutputField(desc="one episode (group, cue, narrative) per group, in order")


class SelectContinuation(dspy.Signature):
    """Decide whether a new episode continues one of several earlier episodes (P_sel, §3.2.3, Appendix D.1.3).

    Pick the candidate that is the same ongoing event or conversation thread as the new episode
    (it was likely cut apart by the observation window), so the two should become one memory.
    Sharing a person or a general theme is not enough. Answer -1 if none continues it."""

    new_episode: str = dspy.InputField(desc="cue and narrative of the new episode")
    candidates: str = dspy.InputField(desc="numbered earlier episodes: '[k] (date span) cue: narrative', or "
                                      "'[k] (date span) cue' when only cues are sent")
    choice: int = dspy.OutputField(desc="number k of the continued candidate, or -1 for none")


class IntegrateEpisodes(dspy.Signature):
    """Merge an earlier episode and its continuation into one episode (P_int, §3.2.3, Appendix D.1.4).

    Write one cue and one chronological third-person narrative covering both, keeping every concrete
    detail and absolute date from each; resolve overlaps without repeating them; do not invent facts."""

    earlier_episode: str = dspy.InputField(desc="cue and narrative of the earlier episode, with its date span")
    new_episode: str = dspy.InputField(desc="cue and narrative of the continuing episode, with its date span")
    cue: str = dspy.OutputField(desc="one-line title of the merged episode with the absolute date(s)")
    narrative: str = dspy.OutputField(desc="merged third-person narrative with absolute dates")
