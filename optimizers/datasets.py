"""Stage datasets for tuning, split by conversation, from a built memory's stage records + LoCoMo's QA.

Labels come from LoCoMo's questions: a question's evidence ``dia_id``s locate the episode(s) holding those
turns, and an episode's labels are the scored questions (with their gold answers) having at least one
evidence turn among its messages. Construction-stage examples come from the records written while the
memory was built (``nemori_dspy.recording``), so a trial re-runs one stage call, never the whole build.

``partition`` has no stage dataset: its hard constraint (a true partition) is enforced by
``repair_partition`` whatever the model says, and LoCoMo's only boundary labels (sessions) are already
enforced by the time-gap split (``episode_split_gap_hours``), so the weak labels left would score nothing
the pipeline does not already guarantee. Tune it end to end (``optimize --metric end-to-end``).

``narrate`` can also take its examples from LoCoMo's sessions with no memory built
(``narrate_session_examples``, ``optimize --examples sessions``): the default forms one episode per session on
LoCoMo, so a session rendered as the pipeline renders an episode for P_nar is the input P_nar sees, and every
conversation's sessions count (conv-49 alone has 25) without an 80-minute construction per conversation.
"""

from __future__ import annotations

import json
import random
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import dspy

from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.locomo import SCORED_CATEGORIES, LoCoMoConversation, LoCoMoQuestion, session_of
from nemori_dspy.eval.metrics import norm_id
from nemori_dspy.recording import StageRecord

if TYPE_CHECKING:
    from nemori_dspy.config import NemoriSettings

__all__ = ["questions_for", "observations_for", "narrate_examples", "narrate_session_examples", "distill_examples", "consolidate_examples",
           "consolidation_cases", "dated_case", "check_split", "PAIR_ACTIONS", "CONSOLIDATION_PAIRS_PATH", "CONSOLIDATION_CASES"]


def questions_for(conv: LoCoMoConversation, message_ids: Iterable[str],
                  categories: Sequence[int] = SCORED_CATEGORIES) -> list[LoCoMoQuestion]:
    """The scored questions of ``conv`` (non-empty gold answer) with at least one evidence turn in
    ``message_ids`` (ids compared in canonical ``D<s>:<t>`` form), in file order."""
    ids = {norm_id(m) for m in message_ids}
    return [q for q in conv.questions
            if q.category in categories and q.answer and any(norm_id(e) in ids for e in q.evidence)]


def _by_user(conversations: Iterable[LoCoMoConversation]) -> dict[str, LoCoMoConversation]:
    return {c.sample_id: c for c in conversations}


def observations_for(conv: LoCoMoConversation, message_ids: Iterable[str]) -> list[str]:
    """Texts of ``conv``'s gold observations (LoCoMo ``observation``) resting on at least one of ``message_ids``
    (canonical ``D<s>:<t>`` ids), in file order; [] for a file without observations."""
    ids = {norm_id(m) for m in message_ids}
    return [o.text for o in conv.observations if any(norm_id(d) in ids for d in o.dia_ids)]


def _labels(conv: LoCoMoConversation, message_ids: list[str]) -> dict:
    qs = questions_for(conv, message_ids)
    return {"gold_answers": [q.answer for q in qs], "questions": [q.question for q in qs],
            "observations": observations_for(conv, message_ids), "sample_id": conv.sample_id}


def _labelled(labels: dict) -> bool:
    """An example the metrics can score: a question's evidence or a gold observation lies in it."""
    return bool(labels["gold_answers"] or labels["observations"])


def narrate_examples(records: list[StageRecord], conversations: Iterable[LoCoMoConversation],
                     labelled_only: bool = True) -> list[dspy.Example]:
    """One example per recorded P_nar call of the given conversations.

    Returns:
        Examples with input ``messages`` (exactly the text the stage saw) and labels ``gold_answers``,
        ``questions``, ``observations`` (gold observation texts of its turns), ``sample_id``, ``recorded`` (the
        narrative that was written). With ``labelled_only``, calls whose episode holds neither a question's
        evidence nor a gold observation are left out (they give the metric nothing to count).
    """
    convs = _by_user(conversations)
    out = []
    for rec in records:
        conv = convs.get(rec.meta.get("user_id", ""))
        if rec.stage != "narrate" or conv is None:
            continue
        labels = _labels(conv, rec.meta.get("message_ids", []))
        if labelled_only and not _labelled(labels):
            continue
        out.append(dspy.Example(messages=rec.inputs["messages"], recorded=rec.outputs.get("narrative", ""),
                                **labels).with_inputs("messages"))
    return out


def narrate_session_examples(conversations: Iterable[LoCoMoConversation], settings: "NemoriSettings",
                             labelled_only: bool = True) -> list[dspy.Example]:
    """One P_nar example per P_nar call of each session, with no memory built (a session taken as one episode, as
    P_par leaves it on LoCoMo): the session cut into the runs the pipeline narrates (``semantic.message_runs`` with
    ``narrate_chunk_messages``; one run when unset), each run's messages rendered exactly as ``EpisodicIntegration``
    renders them for P_nar (``formatting.render_messages`` with the settings' ``max_message_chars``,
    ``max_prompt_chars``, ``resolve_relative_dates``, ``message_timestamps``).

    Returns:
        Examples as ``narrate_examples`` gives them (input ``messages``; labels ``gold_answers``, ``questions``,
        ``observations``, ``sample_id``, of the run's messages), with ``recorded`` = "" (no narrative was written),
        ``session`` (its number) and ``run`` (1, 2, … within the session); runs with neither a question's evidence
        nor a gold observation are left out with ``labelled_only``.
    """
    from nemori_dspy.formatting import render_messages
    from nemori_dspy.modules.semantic import message_runs
    from nemori_dspy.types import StoredMessage

    out = []
    for conv in conversations:
        by_session: dict[int, list[StoredMessage]] = {}
        for seq, m in enumerate(conv.messages, start=1):
            stored = StoredMessage(**m.model_dump(), user_id=conv.sample_id, seq=seq)
            by_session.setdefault(session_of(m.id) or 0, []).append(stored)
        for number, session in sorted(by_session.items()):
            for run, msgs in enumerate(message_runs(session, settings.narrate_chunk_messages), start=1):
                labels = _labels(conv, [m.id for m in msgs])
                if labelled_only and not _labelled(labels):
                    continue
                text = render_messages(msgs, settings.max_message_chars, settings.max_prompt_chars,
                                       settings.resolve_relative_dates, settings.message_timestamps)
                out.append(dspy.Example(messages=text, recorded="", session=number, run=run,
                                        **labels).with_inputs("messages"))
    return out


def distill_examples(records: list[StageRecord], conversations: Iterable[LoCoMoConversation],
                     labelled_only: bool = True) -> list[dspy.Example]:
    """One example per distilled episode: its recorded P_ant inputs (cue, evoked facts) joined with its P_dis
    inputs (messages, prediction) by episode id.

    Returns:
        Examples with inputs ``episode_cue``, ``known_facts``, ``episode_messages``, ``predicted_episode`` and
        labels ``gold_answers``, ``questions``, ``observations``, ``known_before`` (entries nearest the episode
        before its distillation), ``sample_id``.
    """
    convs = _by_user(conversations)
    anticipated: dict[tuple[str, str], StageRecord] = {}
    for rec in records:
        if rec.stage == "anticipate":
            anticipated[(rec.meta.get("user_id", ""), rec.meta.get("episode_id", ""))] = rec
    out = []
    for rec in records:
        key = (rec.meta.get("user_id", ""), rec.meta.get("episode_id", ""))
        conv, ant = convs.get(key[0]), anticipated.get(key)
        if rec.stage != "distill" or conv is None:
            continue
        # no P_ant record: it was skipped (nothing known, ``anticipate_without_facts`` off); the cue is in the meta
        cue = ant.inputs["episode_cue"] if ant is not None else rec.meta.get("episode_cue")
        if cue is None:
            continue
        labels = _labels(conv, rec.meta.get("message_ids", []))
        if labelled_only and not _labelled(labels):
            continue
        out.append(dspy.Example(episode_cue=cue, known_facts=ant.inputs.get("known_facts", []) if ant else [],
                                episode_messages=rec.inputs["episode_messages"],
                                predicted_episode=rec.inputs["predicted_episode"],
                                known_before=rec.meta.get("known_before", []), **labels)
                   .with_inputs("episode_cue", "known_facts", "episode_messages", "predicted_episode"))
    return out


#: Hand-written P_con cases with a known right action (people and facts invented for this project).
#: Each: (insight, existing entries, action, 1-based targets). Split: cases of ``group`` "a" train, "b" dev, "c" test.
CONSOLIDATION_CASES: list[dict] = [
    {"group": "a", "insight": "Priya now prefers tea over coffee (June 2024).",
     "existing": ["Priya drinks two cups of coffee every morning (March 2024).", "Priya works as a nurse."],
     "action": "conflict", "targets": [1]},
    {"group": "a", "insight": "Tomas adopted a second cat named Pixel in May 2024.",
     "existing": ["Tomas has a cat named Biscuit.", "Tomas lives in Porto."], "action": "merge", "targets": [1]},
    {"group": "a", "insight": "Lena started learning the cello in 2023.",
     "existing": ["Lena's brother plays football.", "Lena likes hiking in the Alps."], "action": "new", "targets": []},
    {"group": "a", "insight": "Omar moved from Cairo to Berlin in January 2024.",
     "existing": ["Omar lives in Cairo.", "Omar is a software engineer."], "action": "conflict", "targets": [1]},
    {"group": "a", "insight": "Ines ran the Lisbon half marathon on 6 October 2023 in 1:52.",
     "existing": ["Ines ran the Lisbon half marathon in October 2023.", "Ines has two children."],
     "action": "merge", "targets": [1]},
    {"group": "a", "insight": "Kofi is allergic to peanuts.",
     "existing": ["Kofi enjoys cooking Ghanaian food.", "Kofi's sister lives in Accra."], "action": "new",
     "targets": []},
    {"group": "a", "insight": "Mara is no longer vegetarian since spring 2024.",
     "existing": ["Mara has been vegetarian for five years.", "Mara likes Italian food."],
     "action": "conflict", "targets": [1]},
    {"group": "a", "insight": "Jun plays the guitar and the piano.",
     "existing": ["Jun plays the guitar.", "Jun studies biology."], "action": "merge", "targets": [1]},
    {"group": "b", "insight": "Aisha switched from running to swimming in August 2024.",
     "existing": ["Aisha runs 5 km every day (2023).", "Aisha has a dog named Rumi."],
     "action": "conflict", "targets": [1]},
    {"group": "b", "insight": "Felix visited Kyoto with his sister in April 2024.",
     "existing": ["Felix works at a bakery.", "Felix's favourite colour is green."], "action": "new", "targets": []},
    {"group": "b", "insight": "Noor's daughter Lina turned six on 3 March 2024.",
     "existing": ["Noor has a daughter named Lina.", "Noor teaches maths."], "action": "merge", "targets": [1]},
    {"group": "b", "insight": "Ravi now works remotely for a company in Toronto.",
     "existing": ["Ravi commutes to an office in Mumbai every day.", "Ravi likes cricket."],
     "action": "conflict", "targets": [1]},
    {"group": "b", "insight": "Elsa is learning Japanese.",
     "existing": ["Elsa speaks Swedish and English.", "Elsa's partner is named Bo."], "action": "new", "targets": []},
    {"group": "b", "insight": "Diego's band played its first concert in Madrid in May 2024.",
     "existing": ["Diego plays drums in a band.", "Diego has a brother."], "action": "merge", "targets": [1]},
    {"group": "c", "insight": "Hana sold her car and now cycles to work.",
     "existing": ["Hana studies architecture.", "Hana drives to work every day."], "action": "conflict",
     "targets": [2]},
    {"group": "c", "insight": "Marco's restaurant closed in February 2024.",
     "existing": ["Marco runs a small restaurant in Naples.", "Marco has a son named Luca."], "action": "conflict",
     "targets": [1]},
    {"group": "c", "insight": "Keiko's cello teacher is a retired orchestra player.",
     "existing": ["Keiko has a cat.", "Keiko takes cello lessons every Thursday."], "action": "merge",
     "targets": [2]},
    {"group": "c", "insight": "Femi married Ada in a small ceremony in Lagos in July 2024.",
     "existing": ["Femi is engaged to Ada.", "Femi works as a pharmacist."], "action": "conflict", "targets": [1]},
    {"group": "c", "insight": "Dario's sister Paola is training to be a nurse.",
     "existing": ["Dario works night shifts on an ambulance crew.", "Dario lives in Turin."], "action": "new",
     "targets": []},
    {"group": "c", "insight": "Noor's neighbour Elias grows tomatoes on his balcony.",
     "existing": ["Noor grows herbs on her windowsill.", "Noor makes pottery."], "action": "new", "targets": []},
]


#: the hand-labelled pairs of the memory issue (one existing entry, one new insight, a ``kind``), shipped beside
#: the tests; ``kind`` → the right P_con action (an update conflicts with the entry, a refinement merges into
#: it, the rest are new facts).
CONSOLIDATION_PAIRS_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "consolidation_pairs.jsonl"
PAIR_ACTIONS = {"update": "conflict", "refinement": "merge", "different_person": "new", "different_topic": "new",
                "same_template": "new"}
#: dates the cases are rendered with: existing entries before the insight, as the pipeline shows candidates.
_EXISTING_DATES, _INSIGHT_DATE = ("2024-03-01", "2024-01-15"), "2024-06-01"


def _pair_cases(path: Path = CONSOLIDATION_PAIRS_PATH) -> list[dict]:
    """The labelled pairs as cases with two existing entries: the pair's own and another pair's (a distractor),
    the pair's entry placed first or second (seeded), so targets vary; group by index: 0 → "a", 1 → "b",
    2 → "c" (mod 3). [] when the file is missing (an installed package without the tests folder)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng, out = random.Random(0), []
    for i, row in enumerate(rows):
        other = rows[(i + 7) % len(rows)]["existing"]
        first = rng.random() < 0.5
        existing = [row["existing"], other] if first else [other, row["existing"]]
        action = PAIR_ACTIONS[row["kind"]]
        out.append({"group": "abc"[i % 3], "insight": row["insight"], "existing": existing, "action": action,
                    "targets": [] if action == "new" else [1 if first else 2], "kind": row["kind"]})
    return out


def consolidation_cases(group: str | None = None) -> list[dict]:
    """``CONSOLIDATION_CASES`` (groups "a", "b", "c") plus the labelled pairs (``_pair_cases``: "a", "b", "c"):
    "a" = train, "b" = dev, "c" = test, None = all."""
    return [c for c in [*CONSOLIDATION_CASES, *_pair_cases()] if group is None or c["group"] == group]


def consolidate_examples(group: str | None = None) -> list[dspy.Example]:
    """P_con examples from ``consolidation_cases(group)``, rendered exactly as the pipeline renders a P_con call
    (``SemanticMemory._ask_one``: ``render_fact`` date prefixes, ``render_entries`` numbering; existing entries
    dated before the insight).

    Returns:
        Examples with inputs ``insight``, ``existing_entries`` and labels ``action``, ``targets`` (1-based).
    """
    from nemori_dspy.formatting import render_entries

    out = []
    for c in consolidation_cases(group):
        insight, existing = dated_case(c)
        out.append(dspy.Example(insight=insight, existing_entries=render_entries(existing), action=c["action"],
                                targets=c["targets"]).with_inputs("insight", "existing_entries"))
    return out


def dated_case(case: dict) -> tuple[str, list[str]]:
    """(insight, existing entries) of one consolidation case with the ``render_fact`` date prefixes the pipeline
    shows P_con: the existing entries dated before the insight (``(2024-06-01) …`` against ``(2024-03-01) …``)."""
    return (f"({_INSIGHT_DATE}) {case['insight']}",
            [f"({d}) {t}" for d, t in zip(_EXISTING_DATES, case["existing"])])


def check_split(train_ids: Sequence[str], dev_ids: Sequence[str], test_ids: Sequence[str] = (),
                slice_name: str | None = None) -> None:
    """Train, dev and test must be different conversations; train and dev must not be empty (test may be).

    Args:
        train_ids / dev_ids / test_ids: conversation ids of each split (``--train``, ``--dev``, ``--test``).
        slice_name: the named slice they came from (``--slice``), so an empty train names it.
    Raises:
        ConfigError: a conversation is in two splits, or train or dev is empty.
    """
    sides = {"--train": train_ids, "--dev": dev_ids, "--test": test_ids}
    for (a, x), (b, y) in combinations(sides.items(), 2):
        both = sorted(set(x) & set(y))
        if both:
            raise ConfigError(f"conversation(s) {both} are in both {a} and {b}. Fix: split by conversation "
                              "(e.g. --train conv-26,conv-30 --dev conv-41 --test conv-42).")
    if slice_name and not train_ids:
        raise ConfigError(f"--slice {slice_name} leaves no train conversation (its conversations are dev"
                          f"{' and test' if test_ids else ''}). Fix: name train conversations with --train "
                          "(e.g. --train conv-26,conv-30).")
    if not train_ids or not dev_ids:
        raise ConfigError("--train and --dev each need at least one conversation id. Fix: e.g. --train conv-26 "
                          "--dev conv-30 (and --test conv-41 for a held-out score).")
