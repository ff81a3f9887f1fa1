"""Semantic Knowledge Distillation (§3.3): evoke → anticipate → distill → consolidate.

``distillation="direct"`` swaps evoke/anticipate/distill for one direct-distillation call
(Nemori-s, Appendix D.2); ``consolidation=False`` appends insights without P_con (Appendix A.2).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import dspy
import numpy as np

from ..errors import LLMError
from ..formatting import render_entries, render_fact, render_insight_candidates, render_messages, strip_fact_date
from ..insight_rules import (FIRST_PERSON, SourceLine, agree_pronouns, dated_message_lines, demo_texts, echoes_demo,
                             mask_people, no_subject, people_named, pronoun_votes, redate, restates_prediction,
                             rule_insight, source_lines, word_key)
from ..junk import is_fragment, junk_reason
from ..noise import is_noise_insight, strip_noise
from ..recording import stage_meta
from ..temporal import strip_relative_notes
from ..types import Episode, SemanticEntry, StoredMessage, span_union
from ..usage import tally
from .resources import Resources

if TYPE_CHECKING:
    from ..config import NemoriSettings

__all__ = ["same_person_candidates", "people_named", "keeps_content", "MERGE_KEEP", "SemanticDistillation", "Consolidation", "DUPLICATE_COSINE", "NOTHING_PREDICTED", "normalise_fact",
           "predict_episode", "dated_cue", "clean_insights", "human_messages", "message_runs",
           "keeps_quotes", "adds_first_person", "glued", "glued_by_pronoun", "GLUE_RATIO", "merge_refusal", "batch_decisions", "settle_decision", "target_numbers"]

log = logging.getLogger(__name__)

#: cosine at or above which an insight counts as a duplicate of an existing entry (logged only).
DUPLICATE_COSINE = 0.95

#: P_dis's ``predicted_episode`` when memory knows nothing to predict from (``anticipate_without_facts`` off).
NOTHING_PREDICTED = "(nothing: memory holds no facts about these people yet)"


def _entry_id(user_id: str, episode_id: str, text: str) -> str:
    return "sem_" + hashlib.sha256(f"{user_id}\x1f{episode_id}\x1f{text}".encode()).hexdigest()[:16]


_TRAILING = re.compile(r"[\s.!?;:,…]+$")


def normalise_fact(text: str) -> str:
    """The comparison key of a fact: case-folded, whitespace collapsed, trailing punctuation dropped.

    ``"Caroline  likes dogs."`` and ``"caroline likes dogs"`` share the key ``"caroline likes dogs"``.
    """
    return _TRAILING.sub("", " ".join(text.split())).casefold()


@dataclass
class Consolidation:
    """The pending semantic changes of one episode: entries to insert and stored ids to delete.

    Keeps a local overlay so later insights of the same episode see earlier ones. ``stored`` maps
    the ids of the user's live stored entries to their ``normalise_fact`` keys (for exact duplicates),
    ``entries`` maps them to the entries (to re-date one an episode restates). A pending insert may
    carry a stored entry's id: it replaces that entry on commit.
    """

    inserts: list[SemanticEntry] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    stored: dict[str, str] = field(default_factory=dict)
    entries: dict[str, SemanticEntry] = field(default_factory=dict)

    def holds(self, text: str) -> bool:
        """True if a live entry (stored and not deleted, or pending) states ``text`` up to ``normalise_fact``."""
        key = normalise_fact(text)
        return (any(normalise_fact(e.text) == key for e in self.inserts)
                or any(k == key and i not in self.deletes for i, k in self.stored.items()))

    def remove(self, ids: list[str]) -> None:
        """Delete entries: a pending insert is dropped, a stored one is scheduled for deletion."""
        pending = {e.id for e in self.inserts}
        self.inserts = [e for e in self.inserts if e.id not in ids]
        self.deletes += [i for i in ids if (i not in pending or i in self.stored) and i not in self.deletes]

    def redate(self, text: str, episode: Episode, naive_timezone: str = "UTC") -> bool:
        """Widen the event span of the live stored entry stating ``text`` to cover ``episode`` (a fact
        restated later is still true later) by a pending same-id copy; True if one was re-dated."""
        key, pending = normalise_fact(text), {e.id for e in self.inserts}
        for i, k in self.stored.items():
            old = self.entries.get(i)
            if k != key or old is None or i in self.deletes or i in pending:
                continue
            start, end = span_union([(old.event_start, old.event_end), (episode.start, episode.end)], naive_timezone)
            if (start, end) == (old.event_start, old.event_end):
                return False
            self.inserts.append(old.model_copy(update={
                "event_start": start, "event_end": end,
                "source_episode_ids": sorted({*old.source_episode_ids, episode.id})}))
            return True
        return False


def clean_insights(raw: object, messages: str = "", source: Sequence[StoredMessage] | None = None,
                   predicted: str = "", demos: tuple[str, ...] = ()) -> list[str]:
    """The insights to store from a P_dis / Nemori-s reply: distinct, non-empty strings (bullets stripped);
    None or [] → [].

    Args:
        raw: the reply's ``insights`` (a list, one string, or None).
        messages: the episode's messages as P_dis saw them (``render_messages`` lines, either timestamp layout).
        source: the episode's ``StoredMessage`` list P_dis saw (speaker, content, timestamp); with ``messages``
            or alone it tells which message an insight copies and its date. Neither given: only the checks that
            need no messages run.
        predicted: P_ant's prediction P_dis saw ("" for the direct distiller): with messages, step 7 runs.
        demos: the texts of the demos the distiller was shown (``insight_rules.demo_texts``), echoes of which
            are dropped in step 2 as seed-demo echoes are.

    Each insight, in order (every drop logged at INFO and counted in the ledger):

    1. machine noise (``noise.is_noise_insight``) → dropped, ``noise_insights_dropped``;
    2. junk (``junk.junk_reason``): an echo of an instruction or a field description, or a placeholder such as
       ``NOTHING_PREDICTED`` → dropped, ``insights_dropped.<instruction_echo|field_description_echo|placeholder>``;
       with messages, a restatement of a seed demo (or of ``demos``) that the episode does not hold
       (``insight_rules.echoes_demo``)
       → dropped, ``insights_dropped.demo_echo``;
    3. with messages, ``insight_rules.rule_insight``: a question → ``insights_dropped.question``; a chat line or a
       copy of a message that carries no fact (greetings, thanks, reactions) → ``insights_dropped.no_fact``; a
       chat line matching no message of its speaker → ``insights_dropped.chat_line``; a sentence that only reports
       a social act between the speakers (``insight_rules.is_pleasantry``: "Jolene thanks Deborah for kind
       words.") → ``insights_dropped.pleasantry``; a picture judged and nothing else
       (``insight_rules.is_picture_reaction``: "The photo … is amazing!") → ``insights_dropped.picture_reaction``;
       any other chat line or copy, or a statement speaking in the
       first person ("Gina used to compete … - my fav memory …") that matches a message,
       becomes an attributed fact (``Sam said on 2023-09-15: “I quit the bakery.”``), ``insights_attributed``; one
       speaking in the first person that matches none → ``insights_dropped.first_person``; a
       statement crediting one speaker with what another said of themselves gets the right name
       (``insight_rules.reattribute``), ``insights_reattributed``, and that speaker's pronouns where the reply and
       the prediction show both speakers' (``insight_rules.agree_pronouns``: "Andrew got tattoos of his dogs" →
       "Audrey got tattoos of her dogs");
    4. a fact with no predicate (``junk.is_fragment``: ``"reading"``, ``"but when I look after myself"``) →
       ``insights_dropped.fragment``;
    5. with messages, a fact opening with a bare pronoun that names no speaker (``no_subject``: "They share
       stories and advice.") → ``insights_dropped.no_subject``;
    6. with messages, a fact dating its event otherwise than the message that tells it (``insight_rules.redate``:
       "ran a charity race on 25 May 2023" for "I ran … on 20 May 2023 (last Saturday)") gets the message's date,
       ``insights_redated``;
    7. with messages and ``predicted``, a fact restating a sentence of the prediction that no message holds
       (``insight_rules.restates_prediction``: "Melanie is planning to adopt a child." from the prediction's
       "… and plans to adopt a child.", on messages about a charity race) → dropped,
       ``insights_dropped.predicted_only``: P_dis keeps what the prediction missed (§3.3.2), not the prediction.

    A third-person fact restating a message (``"Caroline went to an LGBTQ support group on 7 May 2023."``) is kept
    as it is.
    """
    items = raw if isinstance(raw, list) else ([] if raw is None else [raw])
    lines = dated_message_lines(messages) if messages else []
    lines += source_lines(source) if source else []
    votes = pronoun_votes([str(x) for x in items if x is not None] + [predicted], lines)
    out: list[str] = []
    for x in items:
        t = str(x).strip().lstrip("-•* ").strip() if x is not None else ""
        if not t or not normalise_fact(t):
            continue
        fact, reason = _rule(t, lines, demos)
        if reason == "reattributed" and fact is not None:
            fact = agree_pronouns(t, fact, votes, lines)
        if fact is None:
            if reason is not None:
                tally(f"insights_dropped.{reason}" if reason != "noise" else "noise_insights_dropped")
                log.info("insight dropped (%s): %r", reason, t[:200])
            continue
        if predicted and lines and reason != "attributed" and restates_prediction(fact, predicted, lines):
            tally("insights_dropped.predicted_only")
            log.info("insight dropped (predicted_only): %r", t[:200])
            continue
        fact = strip_relative_notes(fact)
        if normalise_fact(fact) in {normalise_fact(o) for o in out}:
            continue
        if reason in ("attributed", "reattributed"):
            tally(f"insights_{reason}")
            log.info("insight %r stored %s as %r", t[:200], reason, fact[:200])
        out.append(fact)
    return out


def _rule(insight: str, lines: list[SourceLine], demos: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
    """(text to store or None, why): steps 1-4 of ``clean_insights`` for one non-empty insight; ``why`` is a drop
    reason (``"noise"`` for machine noise), ``"attributed"``, or None for an insight kept as it is."""
    if is_noise_insight(insight):
        return None, "noise"
    junk = junk_reason(insight)
    if junk is not None:
        return None, junk
    if lines and echoes_demo(insight, lines, demos):
        return None, "demo_echo"
    fact, outcome = rule_insight(insight, lines) if lines else (insight, "kept")
    if fact is None:
        return None, outcome
    if outcome in ("kept", "reattributed") and is_fragment(fact):
        return None, "fragment"
    if outcome == "kept" and lines and no_subject(fact, lines):
        return None, "no_subject"
    if outcome in ("kept", "reattributed") and lines:
        fact, moved = redate(fact, lines)
        if moved:
            tally("insights_redated")
            log.info("insight %r re-dated as %r", insight[:200], fact[:200])
    return fact, None if outcome == "kept" else outcome


def human_messages(messages: list[StoredMessage]) -> list[StoredMessage]:
    """Messages with machine noise removed from their content; those left empty are dropped (counted)."""
    out = []
    for m in messages:
        text = strip_noise(m.content)
        if not text:
            tally("noise_messages_skipped")
            continue
        out.append(m if text == m.content else m.model_copy(update={"content": text}))
    return out


def message_runs(messages: list[StoredMessage], chunk_messages: int | None) -> list[list[StoredMessage]]:
    """``messages`` cut into consecutive runs of at most ``chunk_messages``, as even as possible (23 messages at 8
    → 8, 7, 8); None, or no more messages than that, → one run (the paper: one P_dis and one P_nar call per episode,
    §3.3.2, §3.2.2). The runs P_dis (``distill_chunk_messages``) and P_nar (``narrate_chunk_messages``) read.

    A 1.5B distiller writes about six facts per call however long the episode, so a 20-message session yields a
    quarter of its gold observations in one call; a 1.5B narrator loops on a whole session."""
    n = len(messages)
    if chunk_messages is None or n <= chunk_messages:
        return [list(messages)]
    k = -(-n // chunk_messages)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [list(messages[bounds[i]:bounds[i + 1]]) for i in range(k)]


def dated_cue(episode: Episode) -> str:
    """P_ant's ``episode_cue``: ``(YYYY-MM-DD) cue`` of the episode's first message."""
    return f"({episode.start:%Y-%m-%d}) {episode.cue}"


def predict_episode(anticipate: Callable[..., dspy.Prediction], settings: "NemoriSettings", episode_cue: str,
                    known_facts: list[str]) -> str:
    """P_ant's prediction from the dated cue and the evoked facts (§3.3.1), through ``anticipate`` (the pipeline's
    predictor, or the one an optimizer tunes: the same rule runs in both). With no known fact and
    ``anticipate_without_facts`` off, the prediction is ``NOTHING_PREDICTED`` without an LLM call
    (``anticipate_skipped_no_facts``): a guess from the cue alone knows nothing about these people."""
    if not known_facts and not settings.anticipate_without_facts:
        tally("anticipate_skipped_no_facts")
        return NOTHING_PREDICTED
    return str(anticipate(episode_cue=episode_cue, known_facts=list(known_facts)).predicted_episode)


class SemanticDistillation(dspy.Module):
    """Distill one (new or merged) episode into semantic memory changes.

    ``forward(user_id, episode)`` → ``dspy.Prediction(inserts, deletes, insights, evoked)`` where
    ``inserts``/``deletes`` are for ``MemoryStore.commit_distillation`` and ``evoked`` holds the texts
    of the evoked entries. Nothing is written here.
    Defaults: K_s = 10 and τ = 0.70 on cosine for evocation (§3.3.1), K_m = 5 (§3.3.3).

    Event time: an inserted entry spans its episode's messages (``event_start``/``event_end``); a merge
    spans the union of its targets' and the episode's spans; a conflict's replacement spans the episode.
    P_ant's known facts, P_con's insight and candidates are shown with these dates (``render_fact``).

    Predictors: ``anticipate`` and ``distill`` (``distillation="prediction_error"``) or ``direct_distill``
    (``"direct"``), and ``consolidate`` when ``consolidation`` is on; a stage the configuration does not
    run is None, so it is not in ``named_predictors()`` (nor in what optimizers tune and ``save()`` writes).

    Raises:
        LLMError: a stage failed after retries (the episode stays undistilled; retried next flush).
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module]) -> None:
        super().__init__()
        self.res = resources
        # only the predictors this configuration runs: the program optimizers tune and save() writes is what runs
        s = resources.settings
        direct = s.distillation == "direct"
        self.anticipate = None if direct else make("anticipate")
        self.distill = None if direct else make("distill")
        self.consolidate = make("consolidate") if s.consolidation else None
        self.consolidate_batch = make("consolidate_batch") if s.consolidation and s.consolidation_mode == "batched" else None
        self.direct_distill = make("direct_distill") if direct else None

    def evoke(self, user_id: str, episode: Episode) -> list[SemanticEntry]:
        """S_in = top-K_s entries with cosine > τ (§3.3.1), best first; counts empty contexts in the ledger."""
        s = self.res.settings
        hits = self.res.store.search_semantic(user_id, episode.vector, s.evoke_top_k, threshold=s.evoke_threshold)
        tally("evoke_calls")
        if not hits:
            tally("evoke_empty")
        return [h.entry for h in hits]

    def insights(self, user_id: str, episode: Episode) -> tuple[list[str], list[str]]:
        """K_in: prediction-error insights (§3.3.2), or direct ones for Nemori-s. Returns (insights, evoked
        texts). P_ant sees the evoked facts with their event dates (``render_fact``).

        The distiller sees the episode's messages without machine noise (``noise.strip_noise``); an
        episode of noise only is not distilled (no LLM call), and insights quoting noise are dropped.
        """
        s = self.res.settings
        content = human_messages(episode.messages)
        if not content:
            tally("distill_skipped_noise_only")
            return [], []
        if s.distillation == "direct":
            return self._per_chunk(content, lambda msgs: self.direct_distill(episode_messages=msgs),
                                   demos=demo_texts(self.direct_distill)), []
        evoked = self.evoke(user_id, episode)
        predicted = predict_episode(self.anticipate, s, dated_cue(episode), [render_fact(e) for e in evoked])
        found = self._per_chunk(content, lambda msgs: self.distill(episode_messages=msgs, predicted_episode=predicted),
                                predicted, demo_texts(self.distill))
        return found, [e.text for e in evoked]

    def _per_chunk(self, content: list[StoredMessage], call: Callable[[str], dspy.Prediction],
                   predicted: str = "", demos: tuple[str, ...] = ()) -> list[str]:
        """``call`` (P_dis or the direct distiller) on each run of ``message_runs`` over ``content``; the
        cleaned insights of every run in order (``clean_insights``, with P_ant's ``predicted`` for P_dis), a
        sentence already found in an earlier run kept once."""
        s = self.res.settings
        chunks = message_runs(content, s.distill_chunk_messages)
        if len(chunks) > 1:
            tally("distill_chunks", len(chunks))
        found: list[str] = []
        for chunk in chunks:
            msgs = render_messages(chunk, s.max_message_chars, s.max_prompt_chars, s.resolve_relative_dates,
                                   s.message_timestamps)
            with stage_meta(message_ids=[m.id for m in chunk]):
                found.extend(clean_insights(call(msgs).insights, msgs, chunk, predicted, demos))
        first: dict[str, str] = {}
        for f in found:
            first.setdefault(normalise_fact(f), f)
        return list(first.values())

    def _candidates(self, user_id: str, vec: list[float], plan: Consolidation) -> list[tuple[SemanticEntry, float]]:
        """Top-K_m similar live entries (stored ones not deleted, plus this episode's pending inserts) with
        cosine ≥ ``consolidation_min_similarity`` (all of the top K_m when it is None), best first (§3.3.3).

        ``vec`` is the bare insight's embedding, compared with the entries' vectors of their bare text (the date
        prefix of ``render_fact`` is in P_con's prompt only). Tallies ``consolidation.candidates_below_floor``
        (entries of the top K_m cut by the floor) and ``consolidation.below_floor`` (insights left with none)."""
        k = self.res.settings.consolidation_top_k
        floor = self.res.settings.consolidation_min_similarity
        stored = self.res.store.search_semantic(user_id, vec, k + len(plan.deletes) + len(plan.inserts))
        pending = {e.id for e in plan.inserts}  # a re-dated stored entry is seen as its pending copy
        pool = [(h.entry, h.score) for h in stored if h.entry.id not in plan.deletes and h.entry.id not in pending]
        pool += [(e, _cosine(vec, e)) for e in self._visible_pending(plan)]
        pool.sort(key=lambda p: (-p[1], p[0].id))
        top = pool[:k]
        kept = top if floor is None else [(e, score) for e, score in top if score >= floor]
        if len(kept) < len(top):
            tally("consolidation.candidates_below_floor", len(top) - len(kept))
            if not kept:  # the insight had entries to compare with, none as similar as the floor: no P_con
                tally("consolidation.below_floor")
        return kept

    def _same_topic(self, insight: str, cands: list[tuple[SemanticEntry, float]], speakers: set[str]
                    ) -> list[tuple[SemanticEntry, float]]:
        """``cands`` whose cosine to ``insight``, both with the speakers' names masked (``mask_people``), is at
        least ``consolidation_topic_floor`` (all of them when it is None); tallies ``consolidation.other_topic``
        for those left out. One batch of len(cands) + 1 embeddings when on."""
        floor = self.res.settings.consolidation_topic_floor
        if floor is None or not cands:
            return cands
        vecs = np.asarray(self.res.embed_many([mask_people(t, speakers) for t in [insight] + [e.text for e, _ in cands]]))
        kept = [c for c, v in zip(cands, vecs[1:]) if float(v @ vecs[0]) >= floor]
        if len(kept) < len(cands):
            tally("consolidation.other_topic", len(cands) - len(kept))
        return kept

    def _visible_pending(self, plan: Consolidation) -> list[SemanticEntry]:
        """The pending inserts P_con may see as candidates: all of them under ``consolidate_within_episode``
        (the paper), else only re-dated copies of stored entries (this episode's own insights are left out)."""
        if self.res.settings.consolidate_within_episode:
            return list(plan.inserts)
        return [e for e in plan.inserts if e.id in plan.stored]

    def apply(self, user_id: str, episode: Episode, insight: str, plan: Consolidation) -> None:
        """P_con for one insight k_q: new | merge(idxs, k_μ) | conflict(idxs) applied to ``plan`` (§3.3.3).

        Only candidates at or above ``consolidation_min_similarity`` are shown to P_con, and a merge or
        conflict can only name those, so a dissimilar entry is never deleted; with no candidate the
        insight is inserted as new without an LLM call. Every deletion is logged (INFO) with both texts
        and counted as ``consolidation.deleted``. An exact duplicate (``normalise_fact``) of a live entry is
        skipped without an embedding or LLM call (``insight_duplicates_skipped``); a stored one restated
        by a later episode has its event span widened to cover it (``insight_duplicates_redated``), so
        "the most recent" stays true of it. P_con sees the insight
        and the candidates with their event dates, so it can tell which is newer; a date prefix it copies
        into ``merged_text`` is removed (the merged entry carries the union span instead).
        """
        pending = self._prepare(user_id, episode, insight, plan)
        if pending is None:
            return
        self._ask_one(user_id, episode, plan, *pending)

    def _ask_one(self, user_id: str, episode: Episode, plan: Consolidation, new_entry: SemanticEntry,
                 cands: list[tuple[SemanticEntry, float]]) -> None:
        """One per-insight P_con call for ``new_entry`` against its ``cands``, applied by ``_decide``."""
        d = self.consolidate(insight=render_fact(new_entry),
                             existing_entries=render_entries([render_fact(e) for e, _ in cands]))
        self._decide(user_id, episode, plan, new_entry, cands, str(d.action), d.targets, d.merged_text)

    def apply_batch(self, user_id: str, episode: Episode, insights: list[str], plan: Consolidation) -> None:
        """P_con for every insight of ``episode`` in one ``consolidate_batch`` call (``consolidation_mode="batched"``).

        Same semantics and guards as ``apply``, insight by insight in order: exact duplicates are skipped and
        insights with no candidate above the floor are inserted as new before the call (so later insights see
        them as candidates, as in ``apply``); only the rest go to the call, each with its own numbered
        candidates. A decision's targets number that insight's candidates; a number out of range (hence
        below the floor) or naming an entry an earlier decision of the batch already retired is refused, and
        with no valid target left the insight is stored as new (``_decide``). One pending insight goes
        through ``apply``'s single call. A reply that does not parse, or that lacks a decision for an insight,
        sends those insights to per-insight ``apply`` calls (``consolidation.batch_fallback``).
        """
        asked: list[tuple[str, SemanticEntry, list[tuple[SemanticEntry, float]]]] = []
        for insight in insights:
            pending = self._prepare(user_id, episode, insight, plan)
            if pending is not None:
                asked.append((insight, *pending))
        if len(asked) <= 1:  # one pending insight: the per-insight call is the same cost
            for _, new_entry, cands in asked:
                self._ask_one(user_id, episode, plan, new_entry, cands)
            return
        decisions = self._batch_decisions(asked)
        for q, (insight, new_entry, cands) in enumerate(asked, 1):
            d = decisions.get(q)
            if d is None:
                tally("consolidation.batch_fallback")
                self.apply(user_id, episode, insight, plan)
                continue
            self._decide(user_id, episode, plan, new_entry, cands, str(d["action"]), d["targets"], d["merged_text"])

    def _batch_decisions(self, asked: list[tuple[str, SemanticEntry, list[tuple[SemanticEntry, float]]]]
                         ) -> dict[int, dict]:
        """``batch_decisions`` for the pending insights ``asked``, shown with their event dates (``render_fact``)."""
        return batch_decisions(self.consolidate_batch,
                               [(render_fact(new), [render_fact(e) for e, _ in cands]) for _, new, cands in asked])

    def _prepare(self, user_id: str, episode: Episode, insight: str, plan: Consolidation
                 ) -> tuple[SemanticEntry, list[tuple[SemanticEntry, float]]] | None:
        """Everything before P_con for one insight: None when it is settled without an LLM call (an exact
        duplicate skipped or re-dated; no candidate above the floor → inserted as new), else (its entry,
        its candidates)."""
        if plan.holds(insight):
            tally("insight_duplicates_skipped")
            log.debug("insight %r is already in memory; skipped", insight)
            if plan.redate(insight, episode, self.res.settings.naive_timezone):
                tally("insight_duplicates_redated")
            return None
        vec = self.res.embed(insight)
        new_entry = SemanticEntry(id=_entry_id(user_id, episode.id, insight), user_id=user_id, text=insight,
                                  vector=vec, source_episode_ids=[episode.id], event_start=episode.start,
                                  event_end=episode.end, origin="new")
        cands = self._candidates(user_id, vec, plan) if self.res.settings.consolidation else []
        speakers = _speakers(episode)
        cands = self._same_topic(insight, same_person_candidates(insight, cands, speakers), speakers)
        if any(score >= DUPLICATE_COSINE or e.text.strip().lower() == insight.lower() for e, score in cands):
            tally("insight_duplicates")
        if not cands:
            plan.inserts.append(new_entry)
            tally("consolidation.new")
            return None
        return new_entry, cands

    def _decide(self, user_id: str, episode: Episode, plan: Consolidation, new_entry: SemanticEntry,
                cands: list[tuple[SemanticEntry, float]], action: str, raw_targets: object, raw_merged: object) -> None:
        """Apply one P_con decision to ``plan``. The guard: targets are 1-based numbers into ``cands`` (all at or
        above the floor); a number out of range, or naming an entry no longer live in ``plan`` (retired by an
        earlier decision), is refused (``consolidation.refused_targets``); merge/conflict with no valid target
        left, or merge without text, becomes new."""
        numbers = sorted(set(target_numbers(raw_targets)))
        live = {e.id for e in plan.inserts} | (set(plan.stored) - set(plan.deletes))
        valid = [i for i in numbers if 1 <= i <= len(cands) and cands[i - 1][0].id in live]
        if len(valid) < len(numbers) and action in ("merge", "conflict"):
            tally("consolidation.refused_targets", len(numbers) - len(valid))
        action, valid, merged, refused = settle_decision(action, valid, raw_merged, new_entry.text,
                                                         [cands[i - 1][0].text for i in valid], _speakers(episode))
        if refused is not None:
            tally(f"consolidation.merge_refused_{refused}")
            log.info("merge refused (%s): %r from %r and its targets", refused, raw_merged, new_entry.text)
        targets = [cands[i - 1][0] for i in valid]
        if action == "merge":
            replacement = self._merged(user_id, episode, merged, targets)
        elif action == "conflict":
            new_entry.supersedes = [t.id for t in targets]
            replacement = new_entry
        else:
            replacement = new_entry
        replacement.origin = action
        _retire(plan, targets, replacement, action)
        plan.inserts.append(replacement)
        tally(f"consolidation.{action}")

    def _merged(self, user_id: str, episode: Episode, text: str, targets: list[SemanticEntry]) -> SemanticEntry:
        """The entry replacing merged ``targets``: sources and event span are the union of theirs and the episode's."""
        start, end = span_union([(episode.start, episode.end), *((t.event_start, t.event_end) for t in targets)],
                                self.res.settings.naive_timezone)
        return SemanticEntry(
            id=_entry_id(user_id, episode.id, text), user_id=user_id, text=text, vector=self.res.embed(text),
            source_episode_ids=sorted({episode.id, *(s for t in targets for s in t.source_episode_ids)}),
            supersedes=[t.id for t in targets], event_start=start, event_end=end, origin="merge")

    def forward(self, user_id: str, episode: Episode) -> dspy.Prediction:
        found, evoked = self.insights(user_id, episode)
        live = self.res.store.list_semantic(user_id)
        plan = Consolidation(stored={e.id: normalise_fact(e.text) for e in live}, entries={e.id: e for e in live})
        if self.res.settings.consolidation_mode == "batched":
            self.apply_batch(user_id, episode, found, plan)
        else:
            for insight in found:
                self.apply(user_id, episode, insight, plan)
        tally("insights", len(found))
        return dspy.Prediction(inserts=plan.inserts, deletes=plan.deletes, insights=found, evoked=evoked)


def batch_decisions(predictor: Callable[..., dspy.Prediction], items: list[tuple[str, list[str]]]) -> dict[int, dict]:
    """One batched P_con call (``consolidate_batch``) for ``items`` = [(insight text, its candidate texts)], as
    ``render_insight_candidates`` shows them; returns insight number (1-based) → ``{"action", "targets",
    "merged_text"}`` ({} when the call failed after retries, logged). A second decision for one insight, or one for
    a number not asked about, is ignored; an insight without a decision is absent (the caller falls back to a
    per-insight call). The pipeline and ``benchmarks.consolidation_batch`` both decide through this function."""
    try:
        reply = predictor(insights_with_entries=render_insight_candidates(items), insight_count=len(items)).decisions
    except LLMError as exc:
        log.info("batched consolidation failed, consolidating insight by insight: %s", exc)
        return {}
    out: dict[int, dict] = {}
    for d in reply if isinstance(reply, list) else []:
        d = d.model_dump() if hasattr(d, "model_dump") else d
        q = target_numbers(d.get("insight") if isinstance(d, dict) else None)
        if q and 1 <= q[0] <= len(items) and q[0] not in out:
            out[q[0]] = {"action": d.get("action"), "targets": d.get("targets") or [],
                         "merged_text": d.get("merged_text") or ""}
    return out


def _speakers(episode: Episode) -> set[str]:
    """Case-folded first names of the episode's speakers (the people its facts are about)."""
    return {m.speaker.split()[0].casefold() for m in episode.messages if m.speaker.strip()}


def same_person_candidates(insight: str, cands: list[tuple[SemanticEntry, float]], speakers: set[str]
                           ) -> list[tuple[SemanticEntry, float]]:
    """The P_con candidates that may be about the insight's person (our guard on §3.3.3): one that names only other
    speakers of the conversation than the insight names is left out (``consolidation.other_person``), so a fact of
    Caroline's is never merged into, or retired by, one of Melanie's. MiniLM's cosine is dominated by the topic:
    "Caroline went to an LGBTQ support group" and "Melanie found a painting support group" score above the
    floor. Candidates or insights naming no speaker are kept."""
    mine = people_named(insight, speakers)
    if not mine:
        return cands
    kept = [(e, score) for e, score in cands if not (people_named(e.text, speakers) - mine)
            or people_named(e.text, speakers) & mine]
    if len(kept) < len(cands):
        tally("consolidation.other_person", len(cands) - len(kept))
    return kept


def _keeps_people(merged: str, insight: str, targets: list[str], speakers: set[str]) -> bool:
    """True if a merged statement names only people the insight or its targets' texts name, and the insight's own."""
    allowed = people_named(insight, speakers).union(*(people_named(t, speakers) for t in targets))
    named = people_named(merged, speakers)
    return named <= allowed and people_named(insight, speakers) <= named


#: share of a merged source's content words a merged statement must keep (P_con: "keeping every detail of both").
MERGE_KEEP = 0.5
_STOP = frozenset("that this with from have been were they their there about which would could should very really "
                  "also into when what your just like some them then than said says".split())


def _content(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.casefold()) if len(w) >= 4 and w not in _STOP}


def keeps_content(merged: str, sources: list[str]) -> bool:
    """True if ``merged`` keeps at least ``MERGE_KEEP`` of each source's content words (words of 4+ letters, a few
    function words aside). Seen with the 1.5B model: "Caroline went to an LGBTQ support group on 7 May 2023" merged
    with a charity-race fact into "Caroline helped Melanie with the charity race ...; it was so powerful" (1 of 7
    words kept): P_con's merge must keep every detail of both (§3.3.3), so such a merge is stored as new."""
    merged_words = _content(merged)
    return all(not (w := _content(src)) or len(w & merged_words) >= MERGE_KEEP * len(w) for src in sources)


_QUOTED = re.compile(r"“([^”]+)”")
_PARTS = re.compile(r"(?<=[.!?”])\s+(?=[A-Z“])|;\s+")
#: difflib ratio at which a part of a merged statement is one of its sources restated (``glued``).
GLUE_RATIO = 0.8


def keeps_quotes(merged: str, sources: list[str]) -> bool:
    """True if every “quoted passage” of ``merged`` is word for word (case, spaces and punctuation aside) inside a
    source. Seen with the 1.5B model: a merge rewrote Melanie's quoted "going camping next month" as "… in June
    2023" and added "fun": an attributed quote must stay its speaker's words."""
    said = [word_key(src) for src in sources]
    return all(any(word_key(q) in src for src in said) for q in _QUOTED.findall(merged))


def adds_first_person(merged: str, sources: list[str]) -> bool:
    """True if ``merged``, outside its “quoted passages”, says "I", "my", "we" … (``insight_rules.FIRST_PERSON``)
    where no source does: a memory fact is a third-person statement, and such words are a chat line copied into
    it. Seen with the 1.5B P_con on conv-26: "Caroline told Melanie about choosing adoption services …; the
    transgender stories were so inspiring! I was so happy and thankful for all the support." (the tail copied from a
    quote in an entry it did not target)."""
    def said(text: str) -> set[str]:  # "US" is the country, not "us"
        words = _QUOTED.sub(" ", text).replace("’", "'").split()
        return {w.casefold().strip(".,;:!?()\"") for w in words if w.strip(".,;:!?()") != "US"} & FIRST_PERSON
    return bool(said(merged) - set().union(*(said(src) for src in sources)))


def glued(merged: str, sources: list[str]) -> bool:
    """True if ``merged`` only strings its sources together: it splits (at sentence ends and semicolons) into two or
    more parts and every part restates one source (difflib ratio ≥ ``GLUE_RATIO``, or a source holds it word for
    word). Such a "merge" unifies nothing (P_con's merge is one statement, §3.3.3); the facts stay apart."""
    parts = [p for p in (word_key(x) for x in _PARTS.split(merged)) if p]
    said = [word_key(src) for src in sources]
    return len(parts) >= 2 and all(_restates(p, said) for p in parts)


def _restates(part: str, said: list[str]) -> bool:
    """True if ``part`` (a ``word_key``) is one of ``said`` (sources' ``word_key``s) restated: held word for word, or
    difflib ratio ≥ ``GLUE_RATIO``."""
    return any(part in src or difflib.SequenceMatcher(None, part, src).ratio() >= GLUE_RATIO for src in said)


_PRONOUN_LED = re.compile(r"^\s*(it|this|that|these|those|she|he|they)\b", re.IGNORECASE)


def glued_by_pronoun(merged: str, insight: str, targets: list[str]) -> bool:
    """True if ``merged`` is one source restated, then parts (after ";" or a sentence end) opening with a pronoun
    that glue on a predicate about something else: the small model's way of "merging" unrelated facts. Seen with the
    1.5B P_con: "Melanie shared a photo of her husband and kids; it is special to her" (her *painting* is special),
    "Maria donated her old car to a homeless shelter; it was kept fit by Maria", "Joanna's new screenplay is about
    drama and romance; it meets on Thursday evenings". A pronoun-led part is fine when it carries the insight's news
    ("Caroline went to a support group; it made her feel accepted") or restates a target whose other content words
    the first part already holds, i.e. says what the target says of the same thing ("Priya started a pottery class
    in April 2022; it meets on Thursday evenings" from "Priya's pottery class meets on Thursday evenings"). Of 28
    merges the other checks accepted in four built memories, this refused 14, each one read as glued by hand."""
    parts = [p.strip() for p in _PARTS.split(merged) if p.strip()]
    if len(parts) < 2 or not all(_PRONOUN_LED.match(p) for p in parts[1:]):
        return False
    if not _restates(word_key(parts[0]), [word_key(src) for src in [insight, *targets]]):
        return False
    head = _content(parts[0])
    return any(_glued_on(_content(p), head, _content(insight) - head, [_content(t) for t in targets])
               for p in parts[1:])


def _glued_on(tail: set[str], head: set[str], news: set[str], targets: list[set[str]]) -> bool:
    """One pronoun-led part (its content words ``tail``) glues on a predicate: it carries none of the insight's
    ``news`` and the target it comes from (most words shared) is about something ``head`` does not name."""
    if tail & news:
        return False
    source = max(targets, key=lambda t: len(t & tail), default=set())
    return not (source & tail) or not (source - tail) <= head


def merge_refusal(merged: str, insight: str, targets: list[str], speakers: set[str]) -> str | None:
    """Why a P_con merge of ``insight`` into the entries ``targets`` (their texts) as ``merged`` is refused (stored
    as new instead), or None:
    ``junk`` (echoes an instruction, a field description or a placeholder, ``junk.junk_reason``: a tuned P_con wrote
    "… This information is already present in the existing entries for …" into merged texts), ``person`` (names
    other people, ``_keeps_people``), ``content`` (drops what a source states, ``keeps_content``), ``quote``
    (changes a quoted passage, ``keeps_quotes``), ``first_person`` (says "I" or "we" outside a quote where no source
    does, ``adds_first_person``), ``glued`` (only strings its sources together, ``glued``, or glues
    a predicate on with a pronoun, ``glued_by_pronoun``); the first that applies, in that order."""
    sources = [insight, *targets]
    checks = (("junk", lambda: junk_reason(merged) is not None),
              ("person", lambda: not _keeps_people(merged, insight, targets, speakers)),
              ("content", lambda: not keeps_content(merged, sources)),
              ("quote", lambda: not keeps_quotes(merged, sources)),
              ("first_person", lambda: adds_first_person(merged, sources)),
              ("glued", lambda: glued(merged, sources) or glued_by_pronoun(merged, insight, targets)))
    return next((why for why, fails in checks if fails()), None)


def settle_decision(action: str, targets: list[int], raw_merged: object, insight: str, target_texts: list[str],
                    speakers: set[str]) -> tuple[str, list[int], str, str | None]:
    """The decision the pipeline applies for one P_con reply (the rule of ``SemanticDistillation._decide`` and of the
    optimizers' ``ConsolidateProgram``, so what is tuned is what runs).

    Args:
        action: the reply's action; anything but ``merge``/``conflict`` counts as ``new``.
        targets: its valid 1-based target numbers (in range and live; the caller filters), ``target_texts`` their
            entries' bare texts in the same order.
        raw_merged: the reply's ``merged_text`` (a ``render_fact`` date prefix is removed).
        insight: the new insight's bare text; speakers: the episode's speakers' first names, case-folded
            (``people_named``; empty: the person check passes).
    Returns:
        ``(action, targets, merged_text, refused)``: a merge ``merge_refusal`` refuses (``refused`` names why), a
        merge without text and merge/conflict without a target become ``("new", [], "", …)``; ``merged_text`` is
        only set for a merge."""
    merged = strip_fact_date(str(raw_merged or "")).strip()
    refused = None
    if action == "merge" and targets and merged:
        refused = merge_refusal(merged, insight, target_texts, speakers)
        if refused is None:
            return "merge", list(targets), merged, None
    elif action == "conflict" and targets:
        return "conflict", list(targets), "", None
    return "new", [], "", refused


def _retire(plan: Consolidation, targets: list[SemanticEntry], replacement: SemanticEntry, action: str) -> None:
    """Delete ``targets`` from ``plan``, logging each with the entry that replaces it (``consolidation.deleted``).

    The store records each retired entry with its replacement and ``action`` (``replacement.supersedes`` and
    ``origin``). A target that is only a pending insert of this episode is never stored: in ``supersedes`` it
    stands aside for the stored entries it replaced itself, so their record names the version that is kept."""
    if not targets:
        return
    pending = {e.id for e in plan.inserts} - set(plan.stored)
    for t in targets:
        if t.id in pending:
            at = replacement.supersedes.index(t.id) if t.id in replacement.supersedes else len(replacement.supersedes)
            inherited = [i for i in t.supersedes if i not in replacement.supersedes]
            replacement.supersedes[at:at + 1] = inherited
    plan.remove([t.id for t in targets])
    tally("consolidation.deleted", len(targets))
    for t in targets:
        log.info("consolidation %s deletes %s %r, replaced by %s %r", action, t.id, t.text, replacement.id,
                 replacement.text)


def _cosine(vec: list[float], entry: SemanticEntry) -> float:
    """Dot product of ``vec`` and ``entry.vector`` (both unit vectors: their cosine)."""
    return float(np.dot(np.asarray(vec, dtype=np.float32), np.asarray(entry.vector, dtype=np.float32)))


def target_numbers(raw: object) -> list[int]:
    """The integers of a reply's ``targets`` (a list, or one value), in order; items that are not integers are
    skipped (``["2", 1, "x"]`` → ``[2, 1]``)."""
    out = []
    for x in raw if isinstance(raw, list) else [raw]:
        try:
            out.append(int(x))
        except (TypeError, ValueError):
            continue
    return out
