"""Episodic Memory Integration (§3.2): partition → narrate → associate/merge.

Composition only: prompts live in ``nemori_dspy.signatures``; the store and embedder come in
through ``Resources``.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import dspy
import numpy as np

from ..errors import LLMError
from ..insight_rules import (SourceLine, attribute_captions, carries_no_fact, demo_texts, drop_demo_echoes, drop_restatements, echoes_demo,
                             is_chat_line, is_demo_echo, quote_first_person, quote_text, reattribute,
                             reattribute_sentences, source_lines)
from ..junk import drop_repeated_sentences, junk_reason
from ..formatting import (render_candidates, render_episode, render_groups, render_messages,
                          render_numbered_messages)
from ..types import Episode, ScoredEpisode, StoredMessage, instant
from ..recording import stage_meta
from ..usage import tally
from .resources import Resources
from .semantic import message_runs

if TYPE_CHECKING:
    from ..config import NemoriSettings

__all__ = ["EpisodicIntegration", "polish_narrative", "polish_cue", "repair_partition", "episode_id", "split_at_gaps", "CUE_FALLBACK_CHARS", "batch_narratives",
           "FALLBACK_NARRATIVE_CHARS", "FALLBACK_QUOTE_CHARS", "fallback_narrative", "fallback_cue"]

#: ``fallback_narrative``: at most this many characters in all, and per quoted message (about two sentences).
FALLBACK_NARRATIVE_CHARS = 1200
FALLBACK_QUOTE_CHARS = 240

#: when P_nar / P_int return a narrative but an empty cue, the cue is the narrative's first this many characters:
#: about a title's length (the paper's cues are one short phrase), so lists, P_sel's candidates and the embedded
#: ``cue + narrative`` text still get a short label rather than a second copy of the narrative.
CUE_FALLBACK_CHARS = 80

log = logging.getLogger(__name__)


def episode_id(user_id: str, message_ids: Sequence[str]) -> str:
    """Deterministic episode id from its user and message ids (a replay after a crash reuses it)."""
    raw = user_id + "\x1f" + "\x1f".join(sorted(message_ids))
    return "ep_" + hashlib.sha256(raw.encode()).hexdigest()[:16]


def repair_partition(groups: object, n: int) -> tuple[list[list[int]], list[str]]:
    """Turn an LLM partition reply into a true partition of 1..n (§3.2.1).

    Out-of-range, non-integer and repeated indices are dropped (first occurrence wins); each missing
    index joins the group of its nearest earlier index (else the nearest later one, else a new
    group). Groups come back sorted, each ascending, none empty.

    Returns:
        (groups, problems): the repaired partition and a list of what was wrong ([] if valid).
    """
    problems: list[str] = []
    seen: set[int] = set()
    out: list[list[int]] = []
    for g in groups if isinstance(groups, list) else []:
        cur: list[int] = []
        for x in g if isinstance(g, list) else [g]:
            try:
                i = int(x)
            except (TypeError, ValueError):
                problems.append(f"non-integer {x!r}")
                continue
            if not 1 <= i <= n:
                problems.append(f"out of range {i}")
            elif i in seen:
                problems.append(f"duplicate {i}")
            else:
                seen.add(i)
                cur.append(i)
        if cur:
            out.append(cur)
    if not isinstance(groups, list):
        problems.append(f"not a list: {groups!r}"[:80])
    owner = {i: gi for gi, g in enumerate(out) for i in g}
    for i in range(1, n + 1):
        if i in owner:
            continue
        problems.append(f"missing {i}")
        near = next((owner[j] for j in range(i - 1, 0, -1) if j in owner), None)
        if near is None:
            near = next((owner[j] for j in range(i + 1, n + 1) if j in owner), None)
        if near is None:
            out.append([])
            near = len(out) - 1
        out[near].append(i)
        owner[i] = near
    groups_sorted = sorted((sorted(g) for g in out if g), key=lambda g: g[0])
    return groups_sorted, problems


def batch_narratives(reply: object, n: int) -> list[tuple[str, str]] | None:
    """(cue, narrative) per group from a batched P_nar reply for ``n`` groups, or None when it cannot be used.

    Usable means exactly ``n`` items whose ``group`` numbers are 1..n (any order; they are put in group
    order) and whose narratives are all non-empty. Items may be ``NarratedEpisode`` models or dicts.
    """
    if not isinstance(reply, list) or len(reply) != n:
        return None
    rows = []
    for item in reply:
        get = item.get if isinstance(item, dict) else (lambda k, i=item: getattr(i, k, None))
        try:
            group = int(get("group"))
        except (TypeError, ValueError):
            return None
        cue, narrative = str(get("cue") or "").strip(), str(get("narrative") or "").strip()
        if not narrative:
            return None
        rows.append((group, cue, narrative))
    if sorted(g for g, _, _ in rows) != list(range(1, n + 1)):
        return None
    return [(cue, narrative) for _, cue, narrative in sorted(rows)]


def split_at_gaps(messages: Sequence[StoredMessage], gap_hours: float | None,
                  naive_timezone: str = "UTC") -> list[list[StoredMessage]]:
    """Consecutive runs of ``messages`` with no gap above ``gap_hours`` between neighbours (None: one run).

    Gaps are real elapsed time (``types.instant``; naive timestamps read in ``naive_timezone``), so
    naive and offset-carrying timestamps may be mixed.
    """
    runs: list[list[StoredMessage]] = []
    for m in messages:
        if runs and (gap_hours is None or _hours(runs[-1][-1].timestamp, m.timestamp, naive_timezone) <= gap_hours):
            runs[-1].append(m)
        else:
            runs.append([m])
    return runs


def _hours(earlier: datetime, later: datetime, naive_timezone: str) -> float:
    """Elapsed hours from ``earlier`` to ``later`` (negative if ``later`` is before)."""
    return (instant(later, naive_timezone) - instant(earlier, naive_timezone)).total_seconds() / 3600


def _adjacent(a: Episode, b: Episode, max_gap_hours: float | None, naive_timezone: str = "UTC") -> bool:
    """True if the time spans of ``a`` and ``b`` are at most ``max_gap_hours`` apart (None: always)."""
    if max_gap_hours is None:
        return True
    return max(_hours(b.end, a.start, naive_timezone), _hours(a.end, b.start, naive_timezone)) <= max_gap_hours


def _is_junk(text: str) -> bool:
    """True if a non-empty P_nar / P_int ``text`` echoes an instruction or field description or is a placeholder
    (``junk.junk_reason``); an empty text is not junk here (an empty cue has its own fallback)."""
    return bool(text.strip()) and junk_reason(text) is not None


def _speakers_put_right(narrative: str, lines: list[SourceLine], counter: str) -> str:
    """``narrative`` with sentences crediting the wrong speaker put right (``insight_rules.reattribute_sentences``
    against the episode's message ``lines``), the number moved tallied as ``counter``."""
    narrative, moved = reattribute_sentences(narrative, lines)
    if moved:
        tally(counter, moved)
    return narrative


def polish_narrative(narrative: str, lines: list[SourceLine], demos: tuple[str, ...] = ()) -> str:
    """What the pipeline does to every P_nar narrative before storing it, and the narrate optimizer's program to
    every output it scores (one code path, so what is tuned is what runs): a ``[shares an image: …]`` tag copied
    from the chat becomes a sentence naming whose picture it is (``insight_rules.attribute_captions``;
    ``narrate_captions_attributed``); sentences a looping reply repeats are
    dropped (``junk.drop_repeated_sentences``; tallied ``narrate_repeats_dropped``), so are sentences saying nothing
    an earlier one did not (``insight_rules.drop_restatements``; ``narrate_restatements_dropped``) and sentences
    restating a seed demo, or one of the ``demos`` P_nar was shown, that the episode does not hold
    (``insight_rules.drop_demo_echoes``; ``narrate_demo_echo_dropped``);
    a sentence speaking in the first person becomes an attributed quote of the message it copies or is dropped
    (``insight_rules.quote_first_person``; ``narrate_first_person_quoted`` / ``narrate_first_person_dropped``); then
    a sentence crediting one speaker with another's words gets the right name (``narrate_reattributed``).

    Args:
        narrative: the reply's narrative, stripped.
        lines: the episode's messages as ``(speaker, content, YYYY-MM-DD or None)`` (``insight_rules.source_lines``
            of stored messages, or ``dated_message_lines`` of the rendered prompt text).
        demos: the texts of the demos P_nar was shown (``insight_rules.demo_texts`` of the narrate module).
    Returns:
        The narrative to store ("" stays "").
    """
    narrative, captions = attribute_captions(narrative, lines)
    if captions:
        tally("narrate_captions_attributed", captions)
    narrative, repeats = drop_repeated_sentences(narrative)
    if repeats:
        tally("narrate_repeats_dropped", repeats)
    narrative, restated = drop_restatements(narrative, lines)
    if restated:
        tally("narrate_restatements_dropped", restated)
    narrative, echoes = drop_demo_echoes(narrative, lines, demos)
    if echoes:
        tally("narrate_demo_echo_dropped", echoes)
    narrative, quoted, unquoted = quote_first_person(narrative, lines)
    if quoted:
        tally("narrate_first_person_quoted", quoted)
    if unquoted:
        tally("narrate_first_person_dropped", unquoted)
    return _speakers_put_right(narrative, lines, "narrate_reattributed")


def _day(t: datetime) -> str:
    """``8 May 2023``: the date as narratives write it."""
    return f"{t.day} {t:%B %Y}"


def _names(speakers: list[str]) -> str:
    """``A``, ``A and B``, ``A, B and C``."""
    return speakers[0] if len(speakers) == 1 else f"{', '.join(speakers[:-1])} and {speakers[-1]}"


def fallback_cue(msgs: Sequence[StoredMessage]) -> str:
    """``Caroline and Melanie talked on 8 May 2023``: the cue of ``fallback_narrative``."""
    speakers = list(dict.fromkeys(m.speaker for m in msgs))
    return f"{_names(speakers)} {'talked' if len(speakers) > 1 else 'wrote'} on {_day(msgs[0].timestamp)}"


def polish_cue(cue: str, lines: list[SourceLine]) -> str:
    """``cue`` with each of its "; "-separated clauses that credits the wrong speaker put right
    (``insight_rules.reattribute``, the first-person and both-named rules as for narrative sentences;
    ``narrate_cue_reattributed``): what the pipeline does to every P_nar cue and the narrate optimizer's program to
    every output it scores. P_nar's "Caroline shares a painting of a sunset over a lake with Melanie" (Melanie's
    picture) went on to P_ant's prediction and to retrieval. Unchanged when no clause moves."""
    clauses = cue.split("; ")
    fixed = [reattribute(clause, lines, second_person=False) for clause in clauses]
    moved = sum(changed for _, changed in fixed)
    if not moved:
        return cue
    tally("narrate_cue_reattributed", moved)
    return "; ".join(text for text, _ in fixed)


def _own_cue(msgs: Sequence[StoredMessage], lines: list[SourceLine], cue: str, demos: tuple[str, ...] = ()) -> str:
    """``cue`` with its speakers put right (``polish_cue``), or ``fallback_cue`` when it restates a seed demo (or one
    of ``demos``) the episode's message ``lines`` do not hold (``insight_rules.echoes_demo``;
    ``narrate_demo_echo_cue``), e.g. "Gina tells Jon about adopting her rescue greyhound Biscuit" for a session
    about Jon losing his job."""
    if echoes_demo(cue, lines, demos):
        tally("narrate_demo_echo_cue")
        return fallback_cue(msgs)
    return polish_cue(cue, lines)


def fallback_narrative(msgs: Sequence[StoredMessage], max_chars: int = FALLBACK_NARRATIVE_CHARS) -> str:
    """A narrative that is faithful by construction, for an episode P_nar gave none for: ``On 8 May 2023 Caroline
    and Melanie talked. Caroline said: “I went to a support group.” Melanie said: “…”``.

    Each message is quoted (at most ``FALLBACK_QUOTE_CHARS`` characters, ``insight_rules.quote_text``) and
    attributed to its speaker, in order, with ``On <date>`` wherever the day changes; messages that carry no fact
    (``insight_rules.carries_no_fact``: greetings, thanks, reactions) are left out unless every one is such. Quotes
    stop before the text would pass ``max_chars`` (at least one is kept), and the rest are counted:
    ``(3 more messages)``.
    """
    speakers = list(dict.fromkeys(m.speaker for m in msgs))
    telling = [m for m in msgs if not carries_no_fact(m.content, set(speakers))] or list(msgs)
    parts = [f"On {_day(msgs[0].timestamp)} {_names(speakers)} talked." if len(speakers) > 1 else ""]
    day = _day(msgs[0].timestamp) if len(speakers) > 1 else None
    for n, m in enumerate(telling):
        when = "" if _day(m.timestamp) == day else f"On {_day(m.timestamp)} "
        day = _day(m.timestamp)
        part = f"{when}{m.speaker} said: \u201c{quote_text(m.content, FALLBACK_QUOTE_CHARS)}\u201d"
        if n and len(" ".join([*parts, part])) > max_chars:
            parts.append(f"({len(telling) - n} more message{'s' if len(telling) - n > 1 else ''})")
            break
        parts.append(part)
    return " ".join(p for p in parts if p)


def _merged_guard(old: Episode, new: Episode, cue: str, narrative: str) -> tuple[str, str]:
    """P_int's (cue, narrative), with a junk narrative (``junk.junk_reason``) replaced by the two narratives in
    order and a junk cue by the earlier cue (``integrate_junk_fallback``, no re-ask)."""
    if _is_junk(narrative) or _is_junk(cue):
        tally("integrate_junk_fallback")
        narrative = f"{old.narrative} {new.narrative}" if _is_junk(narrative) else narrative
        cue = old.cue if _is_junk(cue) else cue
    return cue, narrative


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of two vectors (unit vectors from the embedder: their dot product; 0.0 if either is empty)."""
    if not len(a) or not len(b):
        return 0.0
    va, vb = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return float(va @ vb / ((np.linalg.norm(va) * np.linalg.norm(vb)) or 1.0))


def association_candidates(ep: Episode, hits: Sequence[ScoredEpisode], current: dict[str, Episode],
                           settings: "NemoriSettings") -> list[Episode]:
    """The merge candidates P_sel sees for ``ep`` (§3.2.3): the top-K_e ``hits``, each as its latest version in
    ``current`` (an episode merged earlier in this window), deduplicated, then the two guards.

    * time guard: ``association_max_gap_hours`` (None, the default: off) drops candidates further apart in time;
      when it drops every candidate, ``association.no_candidate_in_gap`` is tallied;
    * similarity guard: ``association_min_similarity`` keeps candidates whose cosine to ``ep`` (v = emb(cue ‖
      narrative)) is at or above it; when none is left, ``association.below_similarity`` is tallied (no P_sel).

    ``association.candidates`` counts the candidates considered (after deduplication, before the guards).
    Returns the kept candidates, best first.
    """
    seen: dict[str, tuple[Episode, float]] = {}
    for h in hits:
        c = current.get(h.episode.id, h.episode)
        score = h.score if c is h.episode else _cosine(ep.vector, c.vector)
        if c.id not in seen or score > seen[c.id][1]:
            seen[c.id] = (c, score)
    if not seen:
        return []
    tally("association.candidates", len(seen))
    cands = [(c, score) for c, score in seen.values()
             if _adjacent(c, ep, settings.association_max_gap_hours, settings.naive_timezone)]
    if not cands:
        tally("association.no_candidate_in_gap")
        return []
    floor = settings.association_min_similarity
    kept = cands if floor is None else [(c, score) for c, score in cands if score >= floor]
    if not kept:
        tally("association.below_similarity")
    return [c for c, _ in sorted(kept, key=lambda cs: -cs[1])]


def _earliest(times: Iterable[datetime], naive_timezone: str) -> datetime:
    """The earliest of ``times`` by ``instant``, returned as given (its own clock time and offset)."""
    return min(times, key=lambda t: instant(t, naive_timezone))


def _latest(times: Iterable[datetime], naive_timezone: str) -> datetime:
    """The latest of ``times`` by ``instant``, returned as given."""
    return max(times, key=lambda t: instant(t, naive_timezone))


class EpisodicIntegration(dspy.Module):
    """Turn one buffer window into episodes, merging continuations of earlier windows' episodes.

    ``forward(user_id, messages, window)`` → ``dspy.Prediction(episodes=[Episode], superseded=[id])``:
    episodes to store (new or merged, §3.2.3 Case 1/2) and ids of stored episodes they supersede.
    Association searches only episodes of windows < ``window``. Every message lands in exactly
    one returned episode.

    Raises:
        LLMError: narration or integration failed after retries (nothing is stored; the window's
            messages stay in the buffer).
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module]) -> None:
        super().__init__()
        self.res = resources
        self.partition = make("partition")
        self.narrate = make("narrate")
        # only what this configuration runs (see SemanticDistillation): the batched narrator when it is switched on
        self.narrate_batch = make("narrate_batch") if resources.settings.narration_mode == "batched" else None
        self.select = make("select")
        self.integrate = make("integrate")

    def _demos(self) -> tuple[str, ...]:
        """The texts of the demos P_nar (and the batched narrator) is shown: seed, bootstrapped or tuned
        (``insight_rules.demo_texts``), which the echo checks hold a narrative or cue against."""
        return demo_texts(self.narrate) + demo_texts(self.narrate_batch)

    def split(self, messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
        """Cut the window at time gaps (``episode_split_gap_hours``), then P_par each segment."""
        s = self.res.settings
        return [g for seg in split_at_gaps(messages, s.episode_split_gap_hours, s.naive_timezone)
                for g in self.partition_segment(seg)]

    def _partition_input(self, messages: Sequence[StoredMessage]) -> str:
        """P_par's numbered messages: each cut to ``partition_message_chars`` when set (it needs only where the
        topic changes), else clipped to fit ``max_prompt_chars`` as every prompt is."""
        s = self.res.settings
        if s.partition_message_chars is not None:
            return render_numbered_messages(messages, min(s.max_message_chars, s.partition_message_chars),
                                            timestamps=s.message_timestamps)
        return render_numbered_messages(messages, s.max_message_chars, s.max_prompt_chars, s.message_timestamps)

    def partition_segment(self, messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
        """P_par with validation and repair; a segment shorter than ``partition_min_messages`` (default
        ``config.PARTITION_MIN_MESSAGES``) → one group without an LLM call (``partition_skipped_short``)."""
        n = len(messages)
        if n < max(2, self.res.settings.partition_min_messages):
            if n > 1:
                tally("partition_skipped_short")
            return [list(messages)]
        try:
            reply = self.partition(messages=self._partition_input(messages), message_count=n).groups
        except LLMError as exc:
            tally("partition_fallback_whole_window")
            log.warning("partition failed, using the whole window as one episode: %s", exc)
            reply = [list(range(1, n + 1))]
        groups, problems = repair_partition(reply, n)
        if problems:
            tally("partition_repairs")
            log.info("partition reply repaired (%d problems): %s", len(problems), problems[:5])
        return [[messages[i - 1] for i in g] for g in groups]

    def narrate_group(self, user_id: str, msgs: list[StoredMessage], window: int) -> Episode:
        """P_nar: cue + narrative + vector v = emb(cue ‖ narrative) (§3.2.2), never storing junk.

        With ``narrate_chunk_messages`` set (default ``config.NARRATE_CHUNK_MESSAGES``) P_nar runs on each run of
        ``semantic.message_runs`` (consecutive, as even as possible; ``narrate_chunks`` counts runs of an episode
        cut in more than one), each run's reply guarded and polished as below; the narrative is the runs'
        narratives joined in order, the cue their distinct cues joined by "; ".

        Per run, P_nar is asked once more, with the messages in the other ``message_timestamps`` layout (a new prompt, so
        the response cache cannot replay the same reply), when its reply

        * is one of the messages copied as a chat line (``<speaker>: …``, ``insight_rules``) under
          ``message_timestamps="on_change"``: the re-ask dates every message (the paper's layout), where the
          0.5B model does write a narrative (``narrate_copied_line``);
        * has a narrative or cue that echoes an instruction or a field description or is a placeholder
          (``junk.junk_reason``; ``narrate_junk_retry``);
        * has a narrative that only restates a seed demo (``insight_rules.is_demo_echo``;
          ``narrate_demo_echo_retry``), which would otherwise leave nothing to store and the session unbuilt.

        If the re-ask's narrative is junk or a copied chat line too, the episode gets ``fallback_narrative`` (the
        messages quoted, attributed and dated; ``narrate_fallback``); a junk cue alone gets ``fallback_cue``
        (``narrate_fallback_cue``), and so does a cue restating a seed demo (``narrate_demo_echo_cue``). An echo is
        never stored.

        Raises:
            LLMError: a P_nar call failed, or every run's narrative is empty (the messages stay buffered).
        """
        runs = message_runs(msgs, self.res.settings.narrate_chunk_messages)
        if len(runs) > 1:
            tally("narrate_chunks", len(runs))
        parts = [self._narrate_run(run) for run in runs]
        cue = "; ".join(dict.fromkeys(c for c, _ in parts if c))
        narrative = " ".join(n for _, n in parts if n)
        return self._episode(user_id, msgs, cue, narrative, window)

    def _narrate_run(self, msgs: list[StoredMessage]) -> tuple[str, str]:
        """(cue, narrative) of one P_nar call on ``msgs`` with its re-ask and fallbacks (``narrate_group``), the
        narrative polished (``polish_narrative``) and the cue checked against the seed demos (``_own_cue``)."""
        layout = self.res.settings.message_timestamps
        pred = self._narrate(msgs, layout)
        cue, narrative = str(pred.cue), str(pred.narrative)
        lines, demos = source_lines(msgs), self._demos()
        copied = layout != "per_message" and is_chat_line(narrative, {m.speaker for m in msgs})
        echo = is_demo_echo(narrative, lines, demos)
        if copied or echo or _is_junk(narrative) or _is_junk(cue):
            tally("narrate_copied_line" if copied else "narrate_demo_echo_retry" if echo else "narrate_junk_retry")
            pred = self._narrate(msgs, "on_change" if layout == "per_message" else "per_message")
            cue, narrative = self._guarded(msgs, lines, str(pred.cue), str(pred.narrative))
        return _own_cue(msgs, lines, cue.strip(), demos), polish_narrative(narrative.strip(), lines, demos)

    def _guarded(self, msgs: list[StoredMessage], lines: list[SourceLine], cue: str,
                 narrative: str) -> tuple[str, str]:
        """(cue, narrative) of a re-asked P_nar reply with what is still unusable replaced: a junk or copied-line
        narrative by ``fallback_narrative`` (``narrate_fallback``), a junk cue by ``fallback_cue``
        (``narrate_fallback_cue``); so is a narrative that only restates a seed demo (``is_demo_echo``). An empty
        narrative is left for ``_episode`` to refuse."""
        if (_is_junk(narrative) or is_chat_line(narrative, {m.speaker for m in msgs})
                or is_demo_echo(narrative, lines, self._demos())):
            tally("narrate_fallback")
            log.info("P_nar gave no usable narrative after a re-ask (%r); storing the messages quoted", narrative[:200])
            narrative = fallback_narrative(msgs)
        if _is_junk(cue):
            tally("narrate_fallback_cue")
            cue = fallback_cue(msgs)
        return cue, narrative

    def _narrate(self, msgs: list[StoredMessage], timestamps: str) -> dspy.Prediction:
        s = self.res.settings
        with stage_meta(message_ids=[m.id for m in msgs]):
            return self.narrate(messages=render_messages(msgs, s.max_message_chars, s.max_prompt_chars,
                                                         s.resolve_relative_dates, timestamps))

    def narrate_groups(self, user_id: str, groups: list[list[StoredMessage]], window: int) -> list[Episode]:
        """P_nar for every group of a window, one episode per group in order.

        ``narration_mode="batched"`` asks for all groups in one ``narrate_batch`` call (when there are two or
        more); a reply that does not parse, or whose episodes do not match the groups one to one, falls back to
        one ``narrate`` call per group (``narrate_batch_fallback``).

        Raises:
            LLMError: a per-group narration failed or returned an empty narrative.
        """
        if self.res.settings.narration_mode == "batched" and len(groups) > 1:
            episodes = self._narrate_batched(user_id, groups, window)
            if episodes is not None:
                return episodes
            tally("narrate_batch_fallback")
        return [self.narrate_group(user_id, g, window) for g in groups]

    def _narrate_batched(self, user_id: str, groups: list[list[StoredMessage]], window: int) -> list[Episode] | None:
        """One ``narrate_batch`` call for ``groups``; None when the reply cannot be used (see ``batch_narratives``)."""
        s = self.res.settings
        try:
            with stage_meta(message_ids=[m.id for g in groups for m in g]):
                reply = self.narrate_batch(message_groups=render_groups(groups, s.max_message_chars,
                                                                        s.max_prompt_chars, s.resolve_relative_dates,
                                                                        s.message_timestamps),
                                           group_count=len(groups)).episodes
        except LLMError as exc:
            log.info("batched narration failed, narrating group by group: %s", exc)
            return None
        items = batch_narratives(reply, len(groups))
        if items is None:
            log.info("batched narration reply does not match the %d groups; narrating group by group", len(groups))
            return None
        return [self._batched_episode(user_id, g, cue, narrative, window) for g, (cue, narrative) in zip(groups, items)]

    def _batched_episode(self, user_id: str, msgs: list[StoredMessage], cue: str, narrative: str,
                         window: int) -> Episode:
        """The episode of one group of a batched reply; a junk narrative or cue (``junk.junk_reason``), or a narrative
        that only restates a seed demo (``insight_rules.is_demo_echo``), sends the group to ``narrate_group`` (its own
        re-ask and fallback; counted ``narrate_junk_retry``)."""
        if _is_junk(narrative) or _is_junk(cue) or is_demo_echo(narrative, source_lines(msgs), self._demos()):
            tally("narrate_junk_retry")
            return self.narrate_group(user_id, msgs, window)
        return self._episode(user_id, msgs, cue, narrative, window)

    def _episode(self, user_id: str, msgs: list[StoredMessage], cue: str, narrative: str, window: int) -> Episode:
        """The episode of ``msgs`` narrated as (cue, narrative); v = emb(cue ‖ narrative). Sentences the narrative
        repeats are dropped first (``junk.drop_repeated_sentences``; ``narrate_repeats_dropped``), and a sentence
        crediting one speaker with another's words gets the right name (``insight_rules.reattribute_sentences``;
        ``narrate_reattributed``).

        Raises:
            LLMError: the narrative is empty (the messages stay buffered).
        """
        s = self.res.settings
        cue, narrative = cue.strip(), narrative.strip()
        narrative = polish_narrative(narrative, source_lines(msgs), self._demos())
        if not narrative:
            raise LLMError("narration returned an empty narrative; the messages stay buffered. "
                           "Fix: retry later or use a stronger model.")
        ids = [m.id for m in msgs]
        return Episode(id=episode_id(user_id, ids), user_id=user_id, cue=cue or narrative[:CUE_FALLBACK_CHARS],
                       narrative=narrative, message_ids=ids, messages=list(msgs),
                       start=_earliest((m.timestamp for m in msgs), s.naive_timezone),
                       end=_latest((m.timestamp for m in msgs), s.naive_timezone),
                       vector=self.res.embed(f"{cue}\n{narrative}"), window=window)

    def merge(self, old: Episode, new: Episode, window: int) -> Episode:
        """P_int: (c_ν, N_ν) from both; raw = P_k ‖ P_j; re-embedded; supersedes ``old`` (§3.2.3)."""
        tz = self.res.settings.naive_timezone
        pred = self.integrate(earlier_episode=render_episode(old), new_episode=render_episode(new))
        cue, narrative = str(pred.cue).strip(), str(pred.narrative).strip()
        if not narrative:
            raise LLMError("integration returned an empty narrative. Fix: retry later or use a stronger model.")
        cue, narrative = _merged_guard(old, new, cue, narrative)
        narrative = _speakers_put_right(narrative, source_lines(old.messages + new.messages), "integrate_reattributed")
        ids = old.message_ids + [i for i in new.message_ids if i not in set(old.message_ids)]
        return Episode(id=episode_id(new.user_id, ids), user_id=new.user_id, cue=cue or narrative[:CUE_FALLBACK_CHARS],
                       narrative=narrative, message_ids=ids, messages=old.messages + new.messages,
                       start=_earliest((old.start, new.start), tz), end=_latest((old.end, new.end), tz),
                       vector=self.res.embed(f"{cue}\n{narrative}"), supersedes=[old.id, *old.supersedes],
                       window=window)

    def choose(self, ep: Episode, candidates: list[Episode]) -> Episode | None:
        """P_sel over the top-K_e candidates; returns the chosen one or None (idx = -1)."""
        if not candidates:
            return None
        cues_only = self.res.settings.select_inputs == "cues"
        choice = self.select(new_episode=render_episode(ep), candidates=render_candidates(candidates, cues_only)).choice
        try:
            k = int(choice)
        except (TypeError, ValueError):
            return None
        return candidates[k - 1] if 1 <= k <= len(candidates) else None

    def forward(self, user_id: str, messages: Sequence[StoredMessage], window: int) -> dspy.Prediction:
        s = self.res.settings
        out: dict[str, Episode] = {}        # id → episode to store, in creation order
        current: dict[str, Episode] = {}    # stored id (or earlier merged id) → its latest version
        superseded: list[str] = []
        # every P_nar call before any P_sel/P_int: consecutive calls of one stage share their instruction prefix,
        # which the llama.cpp server reuses from the previous prompt (docs/configuration.md, "Cost switches")
        for ep in self.narrate_groups(user_id, self.split(messages), window):
            hits = self.res.store.search_episodes(user_id, ep.vector, s.association_top_k, before_window=window)
            target = self.choose(ep, association_candidates(ep, hits, current, s))
            if target is not None:
                merged = self.merge(target, ep, window)
                tally("episode_merges")
                if target.id in out:
                    del out[target.id]
                else:
                    superseded.append(target.id)
                for h in hits:
                    if current.get(h.episode.id, h.episode).id == target.id:
                        current[h.episode.id] = merged
                current[target.id] = merged
                ep = merged
            out[ep.id] = ep
        return dspy.Prediction(episodes=list(out.values()), superseded=superseded)
