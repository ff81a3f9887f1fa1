"""What built memory holds, measured against LoCoMo's own annotations, LLM-free.

LoCoMo gives gold *observations* per session and speaker (``observation``: facts written by gpt-3.5 for the
dataset, each with the ``dia_id`` of the turn(s) it rests on). Over the memory built for one conversation
(read through the ``MemoryStore`` Protocol, user id = the sample id) this module measures:

* **fact recall**: share of the gold observations of the built turns (those whose dia_id is among the
  conversation's messages, so a ``--sessions`` slice counts only its own) that ≥ 1 live semantic entry states;
* **fact support**: share of semantic entries that one to three sentences of a message (or a message's last
  sentence and the next one's first) of their source episode(s) state (``SupportChecker``, validated apart on
  ``tests/data/fact_support_pairs.jsonl``), that are not a fragment (``junk.is_fragment``), not a verbatim copy of one message
  (``insight_rules.is_verbatim_copy``; an attributed quote, ``Sam said on 2023-09-15: “…”``, names who and when
  and is no copy: counted apart as ``attributed``), not junk and credit no speaker with another's words;
* **narrative faithfulness**: share of narrative sentences that their episode's messages state (``SupportChecker``) and that
  credit no speaker with another's words (``insight_rules.misattributed_to``);
* **narrative coverage**: share of the gold observations lying in an episode (by dia_id) that the episode's
  narrative states;
* **junk**: entries and narratives that echo an instruction, a field description or a placeholder
  (``junk.junk_reason``), and entries restating a seed demo their messages do not hold
  (``insight_rules.echoes_demo``: ``demo_echo``), counted per reason;
* shape: episodes per session, messages per episode, facts per episode.

"States" is decided by ``FactMatcher``: embedding cosine (the memory's own embedder) combined with content-word
recall of the gold in the candidate, after a clash check (another person, number, month, weekday or relative;
a negation the other side lacks). Its thresholds were chosen on the hand-labelled pairs of
``tests/data/fact_match_pairs.jsonl`` (synthetic people and facts in LoCoMo's style) with all-MiniLM-L6-v2;
``python -m nemori_dspy.eval.memory_quality validate`` prints its precision, recall and F1 there, and
``VALIDATED`` holds the figures (a test recomputes them). ``... inspect --db ... --data ...`` prints the metrics
and every narrative and fact with its verdicts.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from nltk.stem.porter import PorterStemmer
from pydantic import BaseModel, Field

from nemori_dspy.embedders import Embedder
from nemori_dspy.errors import DatasetError
from nemori_dspy.eval.locomo import LoCoMoConversation, session_of
from nemori_dspy.eval.metrics import format_table
from nemori_dspy.insight_rules import (COPY_RATIO, copied_passage, echoes_demo, first_name_written, is_attributed,
                                      is_question, is_verbatim_copy, misattributed_to, people_named, source_lines,
                                      speaks_of, split_sentences, strip_address)
from nemori_dspy.junk import STOP_WORDS, is_fragment, junk_reason
from nemori_dspy.store.base import MemoryStore
from nemori_dspy.temporal import annotate_relative_dates, dates_agree
from nemori_dspy.types import Episode, SemanticEntry, StoredMessage

__all__ = ["recall_pairs", "PAIRS_PATH", "VALIDATED", "COSINE_STRONG", "COSINE_MIN", "RECALL_MIN", "GoldObservation", "FactMatcher",
           "FactVerdict", "NarrativeVerdict", "ConversationMemoryQuality", "MemoryAudit",
           "MemoryQuality", "terms", "content_recall", "clash", "sentences", "with_adjacent_pairs", "gold_observations", "audit_memory", "aggregate", "memory_table", "validate",
           "load_pairs", "SUPPORT_PAIRS_PATH", "SUPPORT_COSINE_MIN", "SUPPORT_RECALL_MIN", "SUPPORT_BODY_MIN", "SUPPORT_VALIDATED",
           "SupportChecker", "resolve_pronouns", "support_units", "load_support_pairs", "validate_support", "memory_report", "record_memory", "memory_summary_text", "memory_metrics", "main"]

#: the matcher's validation set (hand-labelled; synthetic people and facts).
PAIRS_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "fact_match_pairs.jsonl"

# Thresholds: inside (not at the edge of) the F1 plateau of a grid over the 71 pairs of PAIRS_PATH with
# all-MiniLM-L6-v2 (docs/decisions.md). The clash check comes first: another person, number, date or a negation
# often scores a higher cosine than a paraphrase.
#: cosine at or above which a candidate states the gold without further evidence (no clash).
COSINE_STRONG = 0.90
#: cosine and content-word recall a candidate needs together otherwise.
COSINE_MIN = 0.70
RECALL_MIN = 0.50

#: ``validate`` with all-MiniLM-L6-v2 on ``PAIRS_PATH`` (tests/eval/test_memory_quality.py recomputes it).
VALIDATED: dict[str, Any] = {"embedder": "all-MiniLM-L6-v2", "n": 71, "precision": 32 / 33, "recall": 32 / 33,
                             "f1": 32 / 33}

#: the support checker's validation set (hand-labelled; synthetic people, facts and chat messages).
SUPPORT_PAIRS_PATH = PAIRS_PATH.with_name("fact_support_pairs.jsonl")
# Support thresholds (``SupportChecker``): inside the F1 plateau of a grid (cosine_min 0.50-0.70 × recall_min
# 0.3-0.6) over the 90 pairs of SUPPORT_PAIRS_PATH with all-MiniLM-L6-v2. A fact is compared with one to three
# sentences of a message, so a short paraphrase of one sentence in a long chatty message scores a lower cosine than
# a gold against a fact: the whole-message windows with COSINE_MIN / RECALL_MIN found 9 of its 45 supported facts.
SUPPORT_COSINE_MIN = 0.55
SUPPORT_RECALL_MIN = 0.40
#: share of a text's content words, names and months aside, that the message text of a unit must hold (not counting
#: its "Speaker (Month YYYY):" head): without it "Melanie (June 2023): Great to hear from you." supported "Melanie put
#: on a dress on 8 June 2023" through the head's name and month alone (found reading conv-26; on SUPPORT_PAIRS_PATH
#: it costs one of 51 true positives at 0.2 and three at 0.3).
SUPPORT_BODY_MIN = 0.2
#: ``validate_support`` with all-MiniLM-L6-v2 on ``SUPPORT_PAIRS_PATH`` (tests/eval/test_memory_quality.py recomputes
#: it; its 20 ``pronoun_led`` pairs are read after their ``before`` sentence, ``resolve_pronouns``). The whole-message
#: rule it replaced: precision 9/17, recall 9/45.
SUPPORT_VALIDATED: dict[str, Any] = {"embedder": "all-MiniLM-L6-v2", "n": 149, "precision": 61 / 70,
                                     "recall": 61 / 77, "f1": 122 / 147}
#: words of intent or plan: a message saying "thinking about adopting" or "one day I'd sell them" does not support
#: "adopted" or "sold" (a fact without such a word).
_INTENT = re.compile(r"\b(?:thinking about|think about|planning|plans? to|wants? to|wanting to|hop(?:e|ing) to|going to|"
                     r"gonna|considering|applying|apply|signed up|sign up|would like|one day|someday|by next|might|"
                     r"maybe|looked into|looking into|if)\b", re.IGNORECASE)
#: a text stating a plan or a future event: it does not rest on a message that tells the same thing as done.
_FUTURE = re.compile(r"\b(?:will|is going to|are going to|plans? to|planning|looking forward|intends? to|upcoming|"
                     r"about to|is set to|scheduled|wants? to|hop(?:es|ing) to|would like to|thinking about|"
                     r"considering)\b", re.IGNORECASE)
#: a message speaking of the future (a resolved "tomorrow" / "next week" keeps its words in brackets).
_AHEAD = re.compile(r"\b(?:tomorrow|next|soon|later|in (?:\d+|a|an|one|two|three|four|a few|a couple of) "
                    r"(?:days?|weeks?|months?))\b", re.IGNORECASE)
#: a message speaking of the past: a relative past expression (kept in brackets after its resolved date).
_BEHIND = re.compile(r"\b(?:yesterday|last (?:night|week|weekend|month|year|monday|tuesday|wednesday|thursday|"
                     r"friday|saturday|sunday)|\w+ (?:days?|weeks?|months?|years?) ago)\b", re.IGNORECASE)
#: one rendered message head, ``"Speaker (May 2023): "`` (the support pairs' sources and ``support_units``' units).
_SUPPORT_LINE = re.compile(r"([A-Z][\w'’-]+(?: [A-Z][\w'’-]+)?) \(([A-Z][a-z]+ \d{4})\): ")

_WORDS = re.compile(r"[\w']+")
_STEM = PorterStemmer()
#: relative time words are no content: a date-resolved fact ("on 6 May 2023") states "last Saturday".
_TIME_WORDS = frozenset("yesterday today tomorrow tonight last next week weeks weekend month months year years ago "
                        "recently currently lately soon later earlier day days morning evening night".split())
_NEGATIONS = frozenset("not no never n't cannot nobody nothing neither nor stopped quit longer anymore".split())
_MONTHS = frozenset("january february march april may june july august september october november december".split())
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_KIN = frozenset("""daughter son sister brother mother father mom dad mum wife husband cousin aunt uncle niece nephew
grandmother grandfather grandma grandpa friend partner girlfriend boyfriend fiance fiancee colleague boss
daughters sons sisters brothers cousins kids children""".split())
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({w: str(i) for i, w in enumerate(
    "zeroth first second third fourth fifth sixth seventh eighth ninth tenth".split()) if i})


# --------------------------------------------------------------------------------------------- gold
class GoldObservation(BaseModel):
    """A gold observation of the built turns: ``text`` about ``speaker``, stated in ``session`` at the turns
    ``dia_ids`` (only those among the conversation's messages)."""

    sample_id: str
    session: int
    speaker: str
    text: str
    dia_ids: list[str]


def gold_observations(conv: LoCoMoConversation) -> list[GoldObservation]:
    """The observations of ``conv`` whose dia_id(s) are among its messages (a ``--sessions`` slice keeps only
    its own), each with those dia_ids only; observations with no such dia_id are left out. [] when the file has
    no ``observation`` (e.g. LongMemEval)."""
    ids = {m.id for m in conv.messages}
    out = []
    for obs in conv.observations:
        built = [d for d in obs.dia_ids if d in ids]
        if built:
            out.append(GoldObservation(sample_id=conv.sample_id, session=obs.session, speaker=obs.speaker,
                                       text=obs.text, dia_ids=built))
    return out


# --------------------------------------------------------------------------------------------- matcher
@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _STEM.stem(word)


@dataclass(frozen=True)
class _Terms:
    """What the matcher compares of one text: stemmed content words and the clash categories."""

    content: frozenset[str]
    names: frozenset[str]
    numbers: frozenset[str]
    months: frozenset[str]
    weekdays: frozenset[str]
    kin: frozenset[str]
    negated: frozenset[str]  # stemmed content words within 3 words after a negation


def _words(text: str) -> list[str]:
    return [w[:-2] if w.endswith("'s") else w for w in _WORDS.findall(text.replace("’", "'"))]


@lru_cache(maxsize=16384)
def terms(text: str) -> _Terms:
    """The ``_Terms`` of ``text`` (cached; rules in ``FactMatcher``)."""
    raw = _words(text)
    low = [w.casefold() for w in raw]
    content = [_stem(w) for w in low if w not in STOP_WORDS and w not in _TIME_WORDS and w not in _NEGATIONS
               and not w.isdigit() and w not in _NUMBER_WORDS]
    names = {w.casefold() for w in raw if w[:1].isupper() and w[1:].islower() and w.casefold() not in STOP_WORDS
             and w.casefold() not in _MONTHS | _WEEKDAYS | _TIME_WORDS | _NEGATIONS | set(_NUMBER_WORDS)}
    numbers = {_NUMBER_WORDS.get(w, w.lstrip("0") or "0") for i, w in enumerate(low)
               if (w.isdigit() or w in _NUMBER_WORDS) and not _relative_count(low, i)}
    negated: set[str] = set()
    for i, w in enumerate(low):
        if w in _NEGATIONS or w.endswith("n't"):
            negated |= {_stem(x) for x in low[i + 1:i + 4] if x not in STOP_WORDS}
    return _Terms(frozenset(content), frozenset(names), frozenset(numbers),
                  frozenset(w for w, r in zip(low, raw) if w in _MONTHS and (w != "may" or r[0].isupper())),
                  frozenset(w for w in low if w in _WEEKDAYS), frozenset(_stem(w) for w in low if w in _KIN),
                  frozenset(negated))


_UNITS = frozenset("day days week weeks month months year years".split())


def _relative_count(low: list[str], i: int) -> bool:
    """True if the number at ``low[i]`` counts time from now (``"two weeks ago"``, ``"in 3 days"``, ``"last two
    years"``): a resolved date says the same with other numbers."""
    if i + 1 >= len(low) or low[i + 1] not in _UNITS:
        return False
    return (i + 2 < len(low) and low[i + 2] == "ago") or (i > 0 and low[i - 1] in ("in", "last", "past", "next"))


def content_recall(gold: str, candidate: str) -> float:
    """Share of the gold's stemmed content words (stop and relative-time words, numbers aside) found in the
    candidate; 1.0 when the gold has none. In [0, 1]."""
    g, c = terms(gold).content, terms(candidate).content
    return len(g & c) / len(g) if g else 1.0


def clash(gold: str, candidate: str) -> str | None:
    """Why ``candidate`` cannot state ``gold`` whatever the overlap, or None: ``"name"``, ``"number"``,
    ``"month"``, ``"weekday"``, ``"relative"`` (each side has one the other lacks: another person, place,
    count, date or kin) or ``"negation"`` (one side negates a content word of the other, the other does not)."""
    g, c = terms(gold), terms(candidate)
    for label, a, b in (("name", g.names, c.names), ("number", g.numbers, c.numbers), ("month", g.months, c.months),
                        ("weekday", g.weekdays, c.weekdays), ("relative", g.kin, c.kin)):
        if a - b and b - a:
            return label
    if bool(g.negated & c.content) != bool(c.negated & g.content):
        return "negation"
    return None


class FactMatcher:
    """Decides whether a candidate sentence (a memory entry, a narrative sentence, a chat line ``"Speaker:
    text"``) states a gold sentence.

    Rule: no ``clash``, the candidate is no fragment (``junk.is_fragment``), and either cosine ≥ ``cosine_strong``, or cosine ≥ ``cosine_min`` and content-word recall
    of the gold in the candidate ≥ ``recall_min``. Cosine is of the embedder's L2-normalised vectors (in [-1, 1]);
    every distinct text is embedded once per matcher (cached).

    Args:
        embedder: any ``Embedder`` (the memory's own; the thresholds were validated with all-MiniLM-L6-v2).
        cosine_strong, cosine_min, recall_min: thresholds (defaults ``COSINE_STRONG``, ``COSINE_MIN``,
            ``RECALL_MIN``).
    """

    def __init__(self, embedder: Embedder, cosine_strong: float = COSINE_STRONG, cosine_min: float = COSINE_MIN,
                 recall_min: float = RECALL_MIN) -> None:
        self.embedder = embedder
        self.cosine_strong, self.cosine_min, self.recall_min = cosine_strong, cosine_min, recall_min
        self._vectors: dict[str, np.ndarray] = {}

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if todo:
            for text, vec in zip(todo, np.asarray(self.embedder.embed(todo), dtype=np.float32)):
                self._vectors[text] = vec
        dim = next(iter(self._vectors.values())).shape[0] if self._vectors else 1
        return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, dim), dtype=np.float32)

    def cosines(self, golds: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        """Cosine matrix, shape ``(len(golds), len(candidates))``, float32."""
        if not golds or not candidates:
            return np.zeros((len(golds), len(candidates)), dtype=np.float32)
        return self._embed(golds) @ self._embed(candidates).T

    def decide(self, gold: str, candidate: str, cosine: float) -> bool:
        """The rule on one pair whose cosine is known."""
        if cosine < self.cosine_min or clash(gold, candidate) or is_fragment(candidate):
            return False
        return cosine >= self.cosine_strong or content_recall(gold, candidate) >= self.recall_min

    def match_matrix(self, golds: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        """Boolean matrix, shape ``(len(golds), len(candidates))``: ``[i, j]`` = candidate j states gold i."""
        cos = self.cosines(golds, candidates)
        out = np.zeros(cos.shape, dtype=bool)
        for i, j in zip(*np.nonzero(cos >= self.cosine_min)):
            out[i, j] = self.decide(golds[i], candidates[j], float(cos[i, j]))
        return out

    def matches(self, gold: str, candidate: str) -> bool:
        """True if ``candidate`` states ``gold``."""
        return bool(self.match_matrix([gold], [candidate])[0, 0])

    def info(self) -> dict[str, Any]:
        """Embedder name and thresholds, with the validated precision/recall (``VALIDATED``)."""
        return {"embedder": getattr(self.embedder, "name", str(self.embedder)), "cosine_strong": self.cosine_strong,
                "cosine_min": self.cosine_min, "recall_min": self.recall_min, "validated": dict(VALIDATED)}


# --------------------------------------------------------------------------------------------- support
#: one message as the support checker reads it: (speaker, a stamp such as "May 2023" or "", content)
SupportLine = tuple[str, str, str]


def support_units(lines: Sequence[SupportLine], people: set[str] | None = None) -> list[tuple[str, set[str]]]:
    """What a memory fact or a narrative sentence may rest on, each unit with the people it is about: every run of
    one to three consecutive sentences of a message that states something (not questions only), and a message's
    closing question followed by the first one or two sentences of the next message (the answer). Units read
    ``"Speaker (stamp): text"`` (``"Speaker: text"`` without a stamp). Names that only address the listener are
    taken out first (``insight_rules.strip_address``: "Hey Sam! I ran …" → "I ran …"), so "Tomas, I repainted the
    room" is about its speaker, not Tomas.

    A unit is about the people its text names and about whom it speaks of (``insight_rules.speaks_of``): its
    speaker, or, when it speaks of its listener ("Painting looks like a great outlet for you", more second- than
    first-person words), the other speaker of a chat of two (nobody else in a larger chat). So "Caroline paints"
    rests on no line of Caroline's about Melanie's painting, and a question ("Is this your own painting?") states
    nothing on its own.

    Args:
        lines: the messages, in order, as ``SupportLine``.
        people: case-folded first names of the conversation's people (default: the speakers of ``lines``).
    Returns:
        ``(unit, people it is about)`` pairs, ``[]`` for no message.
    """
    speakers = {who.split()[0].casefold() for who, _, _ in lines if who.strip()}
    names = people if people is not None else speakers
    out: list[tuple[str, set[str]]] = []
    question: tuple[str, set[str]] | None = None
    for who, stamp, content in lines:
        head = f"{who} ({stamp}): " if stamp else f"{who}: "
        me = {who.split()[0].casefold()} if who.strip() else set()
        sents = split_sentences(strip_address(content, names)) or [content.strip()]
        for i in range(len(sents)):
            for j in range(i + 1, min(i + 4, len(sents) + 1)):
                if all(is_question(x) for x in sents[i:j]):
                    continue
                text = " ".join(sents[i:j])
                out.append((head + text, _spoken_of(text, me, speakers) | people_named(text, names)))
        if question is not None:
            asked, about = question
            for k in (1, 2)[:len(sents)]:
                text = " ".join(sents[:k])
                out.append((f"{asked} {head}{text}", _spoken_of(text, me, speakers) | about | people_named(text, names)))
        last = sents[-1]
        question = (head + last, people_named(last, names)) if last.rstrip().endswith("?") else None
    return out


def _spoken_of(text: str, me: set[str], speakers: set[str]) -> set[str]:
    """Whom ``text`` (said by ``me``) speaks of: its speaker, or, when it speaks of its listener, the other speaker
    of a chat of two (nobody in a larger chat, or when ``speakers`` holds no other: then only the names it says)."""
    if speaks_of(text) != "listener":
        return me
    others = speakers - me
    return others if len(others) == 1 else set()


def _subject(text: str, speakers: set[str]) -> str | None:
    """The first speaker (case-folded first name) ``text`` names, or None."""
    low = text.casefold()
    named = sorted(people_named(text, speakers), key=low.find)
    return named[0] if named else None


class SupportChecker:
    """Decides whether the messages of an episode state a memory fact or a narrative sentence ("support").

    Rule: an attributed quote (``Sam said on 2023-09-15: “…”``) is supported when its speaker said the quoted
    passage (``difflib`` ratio ≥ ``insight_rules.COPY_RATIO``); anything else when a ``support_units`` unit states
    it by the ``FactMatcher`` rule with ``SUPPORT_COSINE_MIN`` / ``SUPPORT_RECALL_MIN``, where the unit is about the
    text's subject (the first speaker it names: "Tomas helped Priya repaint" needs a unit about Tomas), does not
    speak of an intent the text states as done (``_INTENT``), does not tell as done ("last Saturday", "two weeks
    ago") what the text states as a plan (``_FUTURE``: "is planning to run a 5k"), and dates its event as the text
    does (``temporal.dates_agree``: "married in June 2023" does not rest on "married in 2018 (5 years ago)"), and
    its message text, not only its head, holds ``SUPPORT_BODY_MIN`` of the text's content words. Validated on ``SUPPORT_PAIRS_PATH``
    (``validate_support``; ``SUPPORT_VALIDATED``); what it misses is semantics no word rule sees (a detail added in
    the same words, "violin" for "cello" in a long sentence, an opinion of the listener's stated as a fact).

    Args:
        embedder: any ``Embedder`` (thresholds validated with all-MiniLM-L6-v2).
        cosine_min, recall_min: thresholds (defaults ``SUPPORT_COSINE_MIN``, ``SUPPORT_RECALL_MIN``).
    """

    def __init__(self, embedder: Embedder, cosine_min: float = SUPPORT_COSINE_MIN,
                 recall_min: float = SUPPORT_RECALL_MIN) -> None:
        self.matcher: Any = FactMatcher(embedder, cosine_min=cosine_min, recall_min=recall_min)

    @classmethod
    def with_matcher(cls, matcher: Any) -> "SupportChecker":
        """A checker deciding "states" with ``matcher`` (anything with ``FactMatcher.match_matrix``) instead of the
        support thresholds: the same units and subject, intent and quote rules (tests use an embedder-free one)."""
        checker = cls.__new__(cls)
        checker.matcher = matcher
        return checker

    def supported(self, texts: Sequence[str], lines: Sequence[SupportLine], people: set[str] | None = None
                  ) -> list[bool]:
        """One flag per text: stated by ``lines`` (the messages it came from). ``people``: case-folded first names
        of the conversation's people (default: the speakers of ``lines``). ``[False] * len(texts)`` without
        messages."""
        speakers = people if people is not None else {w.split()[0].casefold() for w, _, _ in lines if w.strip()}
        found = support_units(lines, speakers)
        if not texts or not found:
            return [False] * len(texts)
        units, unit_people = [u for u, _ in found], [about for _, about in found]
        said = self.matcher.match_matrix(list(texts), units)
        unit_intent = [bool(_INTENT.search(u)) for u in units]
        unit_done = [bool(_BEHIND.search(u)) and not (unit_intent[j] or _FUTURE.search(u) or _AHEAD.search(u))
                     for j, u in enumerate(units)]
        unit_texts = [_unit_text(u) for u in units]
        out = []
        for i, text in enumerate(texts):
            if is_attributed(text):
                out.append(self._quoted(text, lines))
                continue
            who, intent, plan = _subject(text, speakers), bool(_INTENT.search(text)), bool(_FUTURE.search(text))
            out.append(any(said[i, j] and (who is None or who in unit_people[j]) and (intent or not unit_intent[j])
                           and not (plan and unit_done[j]) and dates_agree(text, *unit_texts[j])
                           and _body_recall(text, unit_texts[j][0]) >= SUPPORT_BODY_MIN for j in range(len(units))))
        return out

    @staticmethod
    def _quoted(text: str, lines: Sequence[SupportLine]) -> bool:
        speaker, _, rest = text.partition(" said")
        quote = rest.partition("\u201c")[2].rstrip().removesuffix("\u201d")
        return copied_passage(quote, [(w, c, None) for w, _, c in lines], speaker.strip(), COPY_RATIO) is not None


def _unit_text(unit: str) -> tuple[str, str]:
    """``(message text, send months)`` of a ``support_units`` unit: its text without the ``"Speaker (Month YYYY): "``
    head(s), and the heads' months (``""`` for a unit without a head)."""
    parts = _SUPPORT_LINE.split(unit)
    if len(parts) < 4:
        return unit, ""
    return " ".join(parts[3::3]), " ".join(parts[2::3])


def _body_recall(text: str, body: str) -> float:
    """Share of ``text``'s content words, names and months aside, in ``body`` (a unit's message text, ``_unit_text``;
    1.0 when it has none): what a unit states beyond whom and when its head names."""
    t = terms(text)
    want = t.content - {_stem(w) for w in t.names | t.months}
    return len(want & terms(body).content) / len(want) if want else 1.0


def _support_lines(messages: Sequence[StoredMessage]) -> list[SupportLine]:
    """Stored messages as ``SupportLine``: the month as the stamp (``_render``'s), relative dates resolved."""
    return [(m.speaker, f"{m.timestamp:%B %Y}", annotate_relative_dates(m.content, m.timestamp)) for m in messages]


# --------------------------------------------------------------------------------------------- verdicts
class FactVerdict(BaseModel):
    """One live semantic entry and what the metrics found: ``supported`` (a message window of its source
    episode(s) states it), ``fragment``, ``copy`` (verbatim copy of one message), ``junk`` (reason or None),
    ``gold`` (indexes into ``MemoryAudit.golds`` it states), ``sources_found`` (its source episodes were found),
    ``misattributed`` (it credits one speaker with what another said of themselves: ``insight_rules.misattributed_to``
    over its source messages)."""

    id: str
    text: str
    supported: bool
    fragment: bool
    copy_of_message: bool
    junk: str | None
    misattributed: bool = False
    attributed: bool = False
    gold: list[int] = Field(default_factory=list)
    sources_found: bool = True

    @property
    def counts_as_support(self) -> bool:
        """Supported, and not a fragment, a copy, junk or misattributed. An attributed quote (``attributed``:
        ``Sam said on 2023-09-15: “I quit the bakery.”``, the form the memory issue asks a copied chat line to take)
        is no copy: it names who said it and when."""
        return (self.supported and not self.fragment and not self.copy_of_message and self.junk is None
                and not self.misattributed)


class NarrativeVerdict(BaseModel):
    """One live episode: ``sentences`` of its narrative with ``supported`` and ``misattributed`` flags (same order; a
    sentence crediting one speaker with another's words, ``insight_rules.misattributed_to``, is never supported,
    though a window holding both speakers' messages states it), ``junk`` of the narrative (reason or None), the gold
    observations lying in it (``gold``) and those it states (``covered``), both indexes into ``MemoryAudit.golds``."""

    id: str
    cue: str
    narrative: str
    sessions: list[int]
    messages: int
    sentences: list[str]
    supported: list[bool]
    junk: str | None
    misattributed: list[bool] = Field(default_factory=list)
    gold: list[int] = Field(default_factory=list)
    covered: list[int] = Field(default_factory=list)


class ConversationMemoryQuality(BaseModel):
    """The metrics of one conversation's memory (``sample_id``; ``"all"`` for an aggregate). Shares are in
    [0, 1] (None when their denominator is 0); counts are plain; ``junk_reasons`` maps ``entry:<reason>`` /
    ``narrative:<reason>`` to counts."""

    sample_id: str
    system: str = "nemori"
    sessions: int = 0
    messages: int = 0
    episodes: int = 0
    entries: int = 0
    gold: int = 0
    gold_matched: int = 0
    fact_recall: float | None = None
    entries_supported: int = 0
    fact_support: float | None = None
    fragments: int = 0
    copies: int = 0
    misattributed: int = 0
    attributed: int = 0
    narrative_sentences: int = 0
    sentences_supported: int = 0
    narrative_faithfulness: float | None = None
    gold_located: int = 0
    gold_covered: int = 0
    narrative_coverage: float | None = None
    junk_entries: int = 0
    junk_narratives: int = 0
    junk_reasons: dict[str, int] = Field(default_factory=dict)
    episodes_per_session: float | None = None
    messages_per_episode: float | None = None
    facts_per_episode: float | None = None

    def finish(self) -> "ConversationMemoryQuality":
        """Fill the shares and ratios from the counts (returns self)."""
        share = lambda n, d: n / d if d else None  # noqa: E731
        self.fact_recall = share(self.gold_matched, self.gold)
        self.fact_support = share(self.entries_supported, self.entries)
        self.narrative_faithfulness = share(self.sentences_supported, self.narrative_sentences)
        self.narrative_coverage = share(self.gold_covered, self.gold_located)
        self.episodes_per_session = share(self.episodes, self.sessions)
        self.messages_per_episode = share(self.messages, self.episodes)
        self.facts_per_episode = share(self.entries, self.episodes)
        return self


class MemoryAudit(BaseModel):
    """Everything measured on one conversation's memory: the metrics and the verdict behind each figure."""

    metrics: ConversationMemoryQuality
    golds: list[GoldObservation]
    facts: list[FactVerdict]
    narratives: list[NarrativeVerdict]


class MemoryQuality(BaseModel):
    """One system's memory over a run: per-conversation metrics, their aggregate (counts pooled over the
    conversations, shares recomputed from them) and the matcher's settings (``FactMatcher.info``)."""

    system: str
    conversations: list[ConversationMemoryQuality]
    aggregate: ConversationMemoryQuality
    matcher: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------------------------- measuring
def _render(m: StoredMessage) -> str:
    """A message as a chat line with its month and relative dates resolved: ``"Noor (May 2023): ... on 11 May 2023
    (yesterday) ..."``. The stamp leaves out the day: a fact dating the event (the class "on Saturday" → 1 April)
    must not clash with the day the message was sent."""
    when = m.timestamp
    content = annotate_relative_dates(m.content, when)
    return f"{m.speaker} ({when:%B %Y}): {content}"


def with_adjacent_pairs(texts: Sequence[str]) -> list[str]:
    """``texts`` followed by every two consecutive ones joined by a space (``len`` 2n − 1 for n ≥ 1): what a gold
    observation or a sentence may be stated by."""
    return [*texts, *(f"{a} {b}" for a, b in zip(texts, texts[1:]))]


def sentences(text: str) -> list[str]:
    """``text`` split into sentences as the pipeline splits narratives (``insight_rules.split_sentences``: a quote
    and its closing mark stay whole), blank ones dropped."""
    return split_sentences(text)


_LEAD_PRONOUN = re.compile(r"(She|He|Her|His)\b(?!['’])")


def resolve_pronouns(sents: Sequence[str], people: set[str]) -> list[str]:
    """``sents`` (a narrative's sentences, in order) with a leading "She"/"He" replaced by the name of the person the
    sentence before is about (its first named person, ``people_named``; case as written there) and a leading
    "Her"/"His" by that name's possessive: "Caroline joined a support group. She said it made her feel accepted"
    → "… Caroline said it made her feel accepted". A sentence naming no one keeps the last person named; before any
    name, and for "They", a sentence is left as it is.

    Why: a narrative sentence is checked on its own against the messages (``SupportChecker``), whose units carry
    the speaker's name; a pronoun-led sentence has no name, so the embedding cosine of a sentence that restates a
    message falls below ``SUPPORT_COSINE_MIN`` (0.53 vs 0.75 with the name, on conv-26's "She said it made her feel
    accepted …"), and it counted as unsupported.

    Args:
        sents: sentences (``sentences``).
        people: case-folded first names of the conversation's people.
    Returns:
        ``list[str]`` of ``len(sents)``; sentences without a leading pronoun unchanged.
    """
    out: list[str] = []
    name: str | None = None
    for sent in sents:
        m = _LEAD_PRONOUN.match(sent)
        if m and name:
            sub = name if m.group(1) in ("She", "He") else f"{name}'s"
            sent = sub + sent[m.end():]
        name = first_name_written(sent, people) or name
        out.append(sent)
    return out


def _sources(store_episodes: list[Episode]) -> dict[str, Episode]:
    """Episode id → the live episode holding its messages (a merged episode's id maps to its successor)."""
    out: dict[str, Episode] = {}
    for ep in store_episodes:
        out[ep.id] = ep
        for old in ep.supersedes:
            out.setdefault(old, ep)
    return out


def _fact_verdicts(entries: list[SemanticEntry], episodes: dict[str, Episode], golds: list[GoldObservation],
                   matcher: FactMatcher, support: SupportChecker, people: set[str]) -> list[FactVerdict]:
    gold_hits = matcher.match_matrix([g.text for g in golds], [e.text for e in entries])
    out = []
    for j, entry in enumerate(entries):
        eps = list({episodes[s].id: episodes[s] for s in entry.source_episode_ids if s in episodes}.values())
        msgs = [m for ep in eps for m in ep.messages]
        lines = source_lines(msgs)
        supported = support.supported([entry.text], _support_lines(msgs), people)[0]
        attributed = is_attributed(entry.text)
        out.append(FactVerdict(
            id=entry.id, text=entry.text, supported=supported, fragment=is_fragment(entry.text), attributed=attributed,
            copy_of_message=not attributed and is_verbatim_copy(entry.text, [(m.speaker, m.content) for m in msgs]),
            junk=junk_reason(entry.text) or ("demo_echo" if echoes_demo(entry.text, lines) else None),
            gold=[int(i) for i in np.nonzero(gold_hits[:, j])[0]],
            sources_found=bool(eps), misattributed=misattributed_to(entry.text, lines) is not None))
    return out


def _narrative_verdicts(episodes: list[Episode], golds: list[GoldObservation],
                        matcher: FactMatcher, support: SupportChecker, people: set[str]) -> list[NarrativeVerdict]:
    where = {mid: ep.id for ep in episodes for mid in ep.message_ids}
    out = []
    for ep in episodes:
        sents = sentences(ep.narrative)
        matched = support.supported(resolve_pronouns(sents, people), _support_lines(ep.messages), people)
        lines = source_lines(ep.messages)
        wrong = [misattributed_to(x, lines, second_person=False) is not None for x in sents]
        supported = [bool(m) and not w for m, w in zip(matched, wrong)]
        located = [i for i, g in enumerate(golds) if any(where.get(d) == ep.id for d in g.dia_ids)]
        candidates = with_adjacent_pairs(sents)
        hits = matcher.match_matrix([golds[i].text for i in located], candidates) if candidates else None
        covered = [i for k, i in enumerate(located) if hits is not None and hits[k].any()]
        out.append(NarrativeVerdict(
            id=ep.id, cue=ep.cue, narrative=ep.narrative,
            sessions=sorted({s for m in ep.message_ids if (s := session_of(m)) is not None}),
            messages=len(ep.message_ids), sentences=sents, supported=supported, misattributed=wrong,
            junk=junk_reason(ep.narrative), gold=located, covered=covered))
    return out


def audit_memory(store: MemoryStore, conv: LoCoMoConversation, matcher: FactMatcher,
                 system: str = "nemori", support: SupportChecker | None = None) -> MemoryAudit:
    """Measure the memory ``store`` holds for ``conv`` (user id ``conv.sample_id``) against its gold
    observations (``gold_observations``). Reads only (``list_episodes``, ``list_semantic``); embeds the texts
    with ``matcher``'s embedder (its calls are charged to the active ``UsageLedger`` like any embedding); support
    by the messages is ``support`` (default: a ``SupportChecker`` on the same embedder)."""
    golds = gold_observations(conv)
    episodes = store.list_episodes(conv.sample_id)
    entries = store.list_semantic(conv.sample_id)
    support = support or SupportChecker(matcher.embedder)
    people = {m.speaker.split()[0].casefold() for m in conv.messages if m.speaker.strip()}
    facts = _fact_verdicts(entries, _sources(episodes), golds, matcher, support, people)
    narratives = _narrative_verdicts(episodes, golds, matcher, support, people)
    reasons: dict[str, int] = {}
    for kind, reason in [("entry", f.junk) for f in facts] + [("narrative", n.junk) for n in narratives]:
        if reason:
            reasons[f"{kind}:{reason}"] = reasons.get(f"{kind}:{reason}", 0) + 1
    matched = {i for f in facts for i in f.gold}
    metrics = ConversationMemoryQuality(
        sample_id=conv.sample_id, system=system,
        sessions=len({s for m in conv.messages if (s := session_of(m.id)) is not None}) or (1 if conv.messages else 0),
        messages=sum(len(ep.message_ids) for ep in episodes), episodes=len(episodes), entries=len(entries),
        gold=len(golds), gold_matched=len(matched), entries_supported=sum(f.counts_as_support for f in facts),
        fragments=sum(f.fragment for f in facts), copies=sum(f.copy_of_message for f in facts),
        misattributed=sum(f.misattributed for f in facts), attributed=sum(f.attributed for f in facts),
        narrative_sentences=sum(len(n.sentences) for n in narratives),
        sentences_supported=sum(sum(n.supported) for n in narratives),
        gold_located=len({i for n in narratives for i in n.gold}),
        gold_covered=len({i for n in narratives for i in n.covered}),
        junk_entries=sum(f.junk is not None for f in facts), junk_narratives=sum(n.junk is not None for n in narratives),
        junk_reasons=reasons).finish()
    return MemoryAudit(metrics=metrics, golds=golds, facts=facts, narratives=narratives)


_COUNTS = ("sessions", "messages", "episodes", "entries", "gold", "gold_matched", "entries_supported", "fragments",
           "copies", "misattributed", "attributed", "narrative_sentences", "sentences_supported", "gold_located", "gold_covered", "junk_entries",
           "junk_narratives")


def aggregate(rows: Iterable[ConversationMemoryQuality], system: str = "nemori") -> ConversationMemoryQuality:
    """The pooled metrics of several conversations (``sample_id="all"``): counts summed, shares recomputed from
    the sums (micro averages: a conversation weighs by its gold observations, entries, sentences)."""
    rows = list(rows)
    out = ConversationMemoryQuality(sample_id="all", system=system,
                                    **{k: sum(getattr(r, k) for r in rows) for k in _COUNTS})
    for r in rows:
        for k, n in r.junk_reasons.items():
            out.junk_reasons[k] = out.junk_reasons.get(k, 0) + n
    return out.finish()


# --------------------------------------------------------------------------------------------- tables
_TABLE_COLUMNS = [("fact recall", "fact_recall", "pct"), ("fact support", "fact_support", "pct"),
                  ("narr. faithful", "narrative_faithfulness", "pct"), ("narr. coverage", "narrative_coverage", "pct"),
                  ("junk entries", "junk_entries", "int"), ("junk narr.", "junk_narratives", "int"),
                  ("fragments", "fragments", "int"), ("copies", "copies", "int"),
                  ("misattributed", "misattributed", "int"), ("attributed quotes", "attributed", "int"),
                  ("ep/session", "episodes_per_session", "num"), ("msg/ep", "messages_per_episode", "num"),
                  ("facts/ep", "facts_per_episode", "num"), ("gold", "gold", "int"), ("entries", "entries", "int")]


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if kind == "pct" else f"{value:.1f}" if kind == "num" else str(value)


def memory_table(qualities: Sequence[MemoryQuality | dict[str, Any]]) -> str:
    """The Memory table (``eval.metrics.format_table``): one row per system and conversation plus the system's
    ``all`` row; shares ×100, ratios to one decimal, counts plain; ``-`` where a share has no denominator."""
    body = []
    for q in qualities:
        q = q if isinstance(q, MemoryQuality) else MemoryQuality.model_validate(q)
        rows = [*q.conversations, q.aggregate] if len(q.conversations) > 1 else q.conversations or [q.aggregate]
        body += [[q.system, r.sample_id, *(_cell(getattr(r, f), k) for _, f, k in _TABLE_COLUMNS)] for r in rows]
    return format_table(["system", "conversation", *(h for h, _, _ in _TABLE_COLUMNS)], body, key_cols=2)


def _caption(matcher: dict[str, Any]) -> str:
    v = matcher.get("validated") or VALIDATED
    note = "" if matcher.get("embedder") in (None, v["embedder"]) else \
        f"; this run's embedder is {matcher['embedder']}, so the figures are indicative only"
    return (f"shares ×100; fact recall against LoCoMo's gold observations of the built turns; matcher validated on "
            f"{v['n']} hand-labelled pairs with {v['embedder']}: precision {100 * v['precision']:.1f}, recall "
            f"{100 * v['recall']:.1f}; support (fact support, narrative faithfulness) checked on "
            f"{SUPPORT_VALIDATED['n']}: precision {100 * SUPPORT_VALIDATED['precision']:.1f}, recall "
            f"{100 * SUPPORT_VALIDATED['recall']:.1f}{note}")


# --------------------------------------------------------------------------------------------- wiring
def memory_report(provider: Any, conversations: Sequence[LoCoMoConversation],
                  systems: Sequence[Any]) -> dict[str, Any] | None:
    """A run summary's ``memory`` section (``RunSummary.memory``): for every distinct Nemori construction among ``systems``
    (``System.builds == "nemori"``, named by its first system), the ``MemoryQuality`` of the memory
    ``provider.memory(system)`` holds, as JSON-ready dicts: ``{"systems": {name: MemoryQuality dump},
    "matcher": FactMatcher.info(), "table": str, "caption": str}``. None when no conversation carries gold
    observations (LongMemEval: nothing to measure against, and its haystacks are costly to embed)."""
    if not any(conv.observations for conv in conversations):
        return None
    seen: dict[str, Any] = {}
    for system in systems:
        if system.builds == "nemori":
            seen.setdefault(system.construction_key(), system)
    out: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for system in seen.values():
        memory = provider.memory(system)
        matcher = FactMatcher(memory.embedder)
        rows = [audit_memory(memory.store, conv, matcher, system.name).metrics for conv in conversations]
        info = matcher.info()
        out[system.name] = MemoryQuality(system=system.name, conversations=rows, aggregate=aggregate(rows, system.name),
                                         matcher=info).model_dump()
    if not out:
        return None
    return {"systems": out, "matcher": info, "table": memory_table(list(out.values())), "caption": _caption(info)}


def record_memory(built: dict[str, Any], tables_md: Path) -> dict[str, Any] | None:
    """Append the Memory table of ``built["memory"]`` (``memory_report``) to ``tables_md``; return that report
    (None when there is none, and the file is left alone)."""
    report = built.get("memory")
    if report:
        with tables_md.open("a", encoding="utf-8") as f:
            f.write(f"\n## Memory ({report['caption']})\n\n```\n{report['table']}\n```\n")
    return report


def memory_summary_text(report: dict[str, Any] | None) -> str | None:
    """The Memory table with its caption (``report``: a run summary's ``memory``), for the printed summary;
    None without a report."""
    return f"\nMemory ({report['caption']}):\n{report['table']}" if report else None


def memory_metrics(report: dict[str, Any] | None) -> dict[str, float]:
    """MLflow metrics of a run summary's ``memory`` report: ``memory.<metric>`` of the first system's aggregate
    and ``memory.<system>.<metric>`` of every system's (shares in [0, 1], counts, ratios); {} without a report."""
    report = report or {}
    out: dict[str, float] = {}
    for i, (name, q) in enumerate((report.get("systems") or {}).items()):
        agg = q["aggregate"]
        values = {k: float(v) for k, v in agg.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out.update({f"memory.{name}.{k}": v for k, v in values.items()})
        if i == 0:
            out.update({f"memory.{k}": v for k, v in values.items()})
    return out


# --------------------------------------------------------------------------------------------- validation
def load_pairs(path: Path = PAIRS_PATH) -> list[dict[str, Any]]:
    """The labelled pairs: one JSON object per line with ``gold``, ``candidate``, ``match`` (bool), ``note``,
    ``kind``.

    Raises:
        DatasetError: the file is missing or a line is not such an object.
    """
    return [item for _, item in _read_pairs(path, ("gold", "candidate", "match"), "fact_match_pairs.jsonl")]


def _read_pairs(path: Path, keys: tuple[str, ...], default: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSONL pairs file, each an object holding ``keys``.

    Raises:
        DatasetError: the file is missing, a line is not JSON or lacks a key (the message names the fix).
    """
    if not path.is_file():
        raise DatasetError(f"{path}: file not found. Fix: pass --pairs tests/data/{default}.")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{n}: not JSON ({exc}). Fix: one JSON object per line.") from exc
        if not isinstance(item, dict) or not set(keys) <= item.keys():
            raise DatasetError(f"{path}:{n}: needs {', '.join(keys)}. Fix: add the missing keys.")
        out.append((n, item))
    return out


def _confusion(said: Sequence[bool], truth: Sequence[bool]) -> dict[str, Any]:
    """``n``, ``tp``/``fp``/``fn``/``tn``, ``precision``, ``recall`` and ``f1`` (in [0, 1]) of ``said`` against
    ``truth``."""
    tp = sum(s and t for s, t in zip(said, truth))
    fp = sum(s and not t for s, t in zip(said, truth))
    fn = sum(t and not s for s, t in zip(said, truth))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"n": len(truth), "tp": tp, "fp": fp, "fn": fn, "tn": len(truth) - tp - fp - fn, "precision": precision,
            "recall": recall, "f1": f1}


def validate(matcher: FactMatcher, pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Precision, recall and F1 (in [0, 1]) of ``matcher`` on ``pairs``, with ``n``, the confusion counts and
    the misjudged pairs (``errors``: each pair with its cosine, recall and clash)."""
    cos = [float(matcher.cosines([p["gold"]], [p["candidate"]])[0, 0]) for p in pairs]
    said = [matcher.decide(p["gold"], p["candidate"], c) for p, c in zip(pairs, cos)]
    errors = [{**p, "cosine": round(c, 3), "recall": round(content_recall(p["gold"], p["candidate"]), 3),
               "clash": clash(p["gold"], p["candidate"])} for p, c, s in zip(pairs, cos, said) if s != p["match"]]
    return {**_confusion(said, [bool(p["match"]) for p in pairs]), "errors": errors}




def _source_lines(source: str) -> list[SupportLine]:
    """A pair's ``source`` (one or two rendered messages, ``"Speaker (May 2023): text Other (May 2023): text"``)
    as ``SupportLine``."""
    parts = _SUPPORT_LINE.split(source)
    return [(parts[i], parts[i + 1], parts[i + 2].strip()) for i in range(1, len(parts) - 2, 3)]


def load_support_pairs(path: Path = SUPPORT_PAIRS_PATH) -> list[dict[str, Any]]:
    """The support checker's labelled pairs: one JSON object per line with ``fact``, ``source`` (one or two
    rendered messages), ``supported`` (bool), ``kind`` and ``note``.

    Raises:
        DatasetError: the file is missing, a line is no such object, or a source holds no rendered message.
    """
    pairs = _read_pairs(path, ("fact", "source", "supported"), "fact_support_pairs.jsonl")
    for n, item in pairs:
        if not _source_lines(str(item["source"])):
            raise DatasetError(f"{path}:{n}: source holds no 'Speaker (Month YYYY): text' message. Fix: render it so.")
    return [item for _, item in pairs]


def _resolved(pair: dict[str, Any], people: set[str]) -> str:
    """A pair's ``fact``; with a ``before`` (the narrative sentence before it), the fact as ``resolve_pronouns``
    reads it after that sentence, as narrative faithfulness checks it."""
    if not pair.get("before"):
        return str(pair["fact"])
    return resolve_pronouns([str(pair["before"]), str(pair["fact"])], people)[1]


def validate_support(checker: SupportChecker, pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Precision, recall and F1 (in [0, 1]) of ``checker`` on the support ``pairs``, with ``n``, the confusion
    counts and the misjudged pairs (``errors``). The people of the pairs' conversations are every speaker of the
    file (a message addressing the listener by name, "Tomas, I repainted …", names its listener only so)."""
    people = {who.split()[0].casefold() for p in pairs for who, _, _ in _source_lines(p["source"])}
    said = [checker.supported([_resolved(p, people)], _source_lines(p["source"]), people)[0] for p in pairs]
    return {**_confusion(said, [bool(p["supported"]) for p in pairs]),
            "errors": [p for p, s in zip(pairs, said) if s != p["supported"]]}


# --------------------------------------------------------------------------------------------- CLI
def _embedder(name: str) -> Embedder:
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.embedders import resolve_embedder

    return resolve_embedder(NemoriSettings(embedder=name))


def _recorded_embedder(db: Path) -> str | None:
    """The embedder name a SQLite store file recorded (``meta.embedder``), read in read-only mode."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            row = c.execute("SELECT value FROM meta WHERE key='embedder'").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.support:
        return _cmd_validate_support(args)
    result = validate(FactMatcher(_embedder(args.embedder)), load_pairs(Path(args.pairs or PAIRS_PATH)))
    print(f"FactMatcher on {args.pairs or PAIRS_PATH} with {args.embedder} (cosine_strong={COSINE_STRONG}, "
          f"cosine_min={COSINE_MIN}, recall_min={RECALL_MIN}):")
    print(f"n={result['n']}  precision={result['precision']:.3f}  recall={result['recall']:.3f}  "
          f"f1={result['f1']:.3f}  (tp={result['tp']} fp={result['fp']} fn={result['fn']} tn={result['tn']})")
    for e in result["errors"]:
        print(f"  {'FP' if not e['match'] else 'FN'} [{e.get('kind', '')}] cos={e['cosine']} recall={e['recall']} "
              f"clash={e['clash']}\n     gold: {e['gold']}\n     cand: {e['candidate']}")
    return 0


def _cmd_validate_support(args: argparse.Namespace) -> int:
    path = Path(args.pairs) if args.pairs else SUPPORT_PAIRS_PATH
    result = validate_support(SupportChecker(_embedder(args.embedder)), load_support_pairs(path))
    print(f"SupportChecker on {path} with {args.embedder} (cosine_min={SUPPORT_COSINE_MIN}, "
          f"recall_min={SUPPORT_RECALL_MIN}):")
    print(f"n={result['n']}  precision={result['precision']:.3f}  recall={result['recall']:.3f}  "
          f"f1={result['f1']:.3f}  (tp={result['tp']} fp={result['fp']} fn={result['fn']} tn={result['tn']})")
    for e in result["errors"]:
        print(f"  {'FN' if e['supported'] else 'FP'} [{e.get('kind', '')}] {e['fact']}\n     source: {e['source']}")
    return 0


def _print_audit(audit: MemoryAudit) -> None:
    print(f"\n=== {audit.metrics.sample_id}: {len(audit.narratives)} episodes, {len(audit.facts)} facts, "
          f"{len(audit.golds)} gold observations")
    print("(narrative sentences: + supported by the episode's messages, - not, as the support checker reads them)")
    for n in audit.narratives:
        print(f"\n[episode {n.id}] sessions {n.sessions}, {n.messages} messages, junk={n.junk}, gold in it "
              f"{len(n.gold)}, stated {len(n.covered)}\n  cue: {n.cue}")
        wrong = n.misattributed or [False] * len(n.sentences)
        for s, ok, bad in zip(n.sentences, n.supported, wrong):
            print(f"  {'+' if ok else '-'} {s}{'  [MISATTRIBUTED]' if bad else ''}")
        for i in n.gold:
            print(f"    gold {'stated' if i in n.covered else 'MISSED'}: {audit.golds[i].text}")
    print("\nfacts (supported / fragment / copy / junk → gold stated):")
    for f in audit.facts:
        flags = (f"{'supported' if f.supported else 'UNSUPPORTED'}{'' if f.sources_found else ' (no source)'}"
                 f"{' FRAGMENT' if f.fragment else ''}{' COPY' if f.copy_of_message else ''}"
                 f"{' MISATTRIBUTED' if f.misattributed else ''}{' ATTRIBUTED' if f.attributed else ''}"
                 f"{' JUNK:' + f.junk if f.junk else ''}")
        print(f"  - {f.text}\n      {flags}" + "".join(f"\n      = gold: {audit.golds[i].text}" for i in f.gold))


def _conversations(args: argparse.Namespace) -> list[LoCoMoConversation]:
    """The ``--conversations`` of ``--data``, cut to ``--sessions``."""
    from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions

    return [slice_sessions(c, parse_sessions(args.sessions))
            for c in load_locomo(args.data, [s.strip() for s in args.conversations.split(",") if s.strip()])]


def _cmd_inspect(args: argparse.Namespace) -> int:
    db = Path(args.db)
    convs = _conversations(args)
    audits, matcher, recorded = _audits(db, convs, args.embedder, args.system)
    rows = [a.metrics for a in audits]
    q = MemoryQuality(system=args.system, conversations=rows, aggregate=aggregate(rows, args.system),
                      matcher=matcher.info())
    print(f"Memory of {db} (stored with embedder {recorded}; matcher on {matcher.info()['embedder']})")
    print(f"({_caption(q.matcher)})")
    print(memory_table([q]))
    for a in audits:
        _print_audit(a)
    return 0


def recall_pairs(a: Sequence[MemoryAudit], b: Sequence[MemoryAudit]) -> dict[str, tuple[list[float], list[float]]]:
    """Per gold observation, paired over two memories built from the same conversations (same order): whether a
    live entry states it (``fact_recall``) and whether a narrative states it (``narrative_coverage``, over the
    observations a narrative of both memories holds). Values are 0/1 lists for :func:`~eval.metrics.paired_compare`.

    Raises:
        ValueError: the audits are not of the same conversations with the same gold observations."""
    out: dict[str, tuple[list[float], list[float]]] = {"fact_recall": ([], []), "narrative_coverage": ([], [])}
    for x, y in zip(a, b, strict=True):
        if [g.text for g in x.golds] != [g.text for g in y.golds]:
            raise ValueError(f"{x.metrics.sample_id} vs {y.metrics.sample_id}: not the same gold observations; "
                             "compare memories of the same conversations and sessions")
        for audit, side in ((x, 0), (y, 1)):
            stated = {i for f in audit.facts for i in f.gold}
            out["fact_recall"][side].extend(float(i in stated) for i in range(len(audit.golds)))
        located = {i for n in x.narratives for i in n.gold} & {i for n in y.narratives for i in n.gold}
        for audit, side in ((x, 0), (y, 1)):
            covered = {i for n in audit.narratives for i in n.covered}
            out["narrative_coverage"][side].extend(float(i in covered) for i in sorted(located))
    return out


def _audits(db: Path, convs: list[LoCoMoConversation], embedder_name: str | None, system: str
            ) -> tuple[list[MemoryAudit], FactMatcher, str | None]:
    from nemori_dspy.store.sqlite import SQLiteStore

    if not db.is_file():
        raise DatasetError(f"{db}: no such memory file. Fix: pass the .sqlite3 an eval or optimize run built.")
    recorded = _recorded_embedder(db)
    matcher = FactMatcher(_embedder(embedder_name or recorded or "all-MiniLM-L6-v2"))
    store = SQLiteStore(db, index_dir=False)  # reads only: list_episodes / list_semantic, no vector index
    try:
        return [audit_memory(store, conv, matcher, system) for conv in convs], matcher, recorded
    finally:
        store.close()


def _cmd_compare(args: argparse.Namespace) -> int:
    from nemori_dspy.eval.metrics import paired_compare, paired_line

    convs = _conversations(args)
    a, matcher, _ = _audits(Path(args.db), convs, args.embedder, "A")
    b, _, _ = _audits(Path(args.vs), convs, args.embedder, "B")
    qa = MemoryQuality(system="A", conversations=[x.metrics for x in a], aggregate=aggregate([x.metrics for x in a], "A"),
                       matcher=matcher.info())
    qb = MemoryQuality(system="B", conversations=[x.metrics for x in b], aggregate=aggregate([x.metrics for x in b], "B"))
    print(f"A = {args.db}\nB = {args.vs}\n({_caption(qa.matcher)})")
    print(memory_table([qa, qb]))
    print("Paired over the same gold observations (×100; paired bootstrap 95% CI; B wins / A wins, exact McNemar p):")
    for name, (xa, xb) in recall_pairs(a, b).items():
        print("  " + paired_line(name, paired_compare(xa, xb, binary=True)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``validate [--pairs P] [--embedder E]`` or ``inspect --db DB --data JSON --conversations IDS
    [--sessions A-B]``; returns the exit code (2 on a data error, with its message on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m nemori_dspy.eval.memory_quality", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="precision/recall/F1 of the fact matcher (or, --support, the support "
                                        "checker) on its labelled pairs")
    v.add_argument("--pairs", default=None, help="default: tests/data/fact_match_pairs.jsonl (--support: "
                                                 "tests/data/fact_support_pairs.jsonl)")
    v.add_argument("--support", action="store_true", help="validate the support checker instead")
    v.add_argument("--embedder", default="all-MiniLM-L6-v2")
    i = sub.add_parser("inspect", help="metrics, narratives and facts of a built memory")
    i.add_argument("--db", required=True, help="the memory's SQLite file")
    i.add_argument("--data", required=True, help="the LoCoMo JSON it was built from")
    i.add_argument("--conversations", required=True, help="sample ids, comma-separated (e.g. conv-26)")
    i.add_argument("--sessions", default=None, help="the slice it was built on, e.g. 1-3")
    i.add_argument("--embedder", default=None, help="matcher embedder (default: the store's, else MiniLM)")
    i.add_argument("--system", default="nemori", help="label of the memory in the table")
    c = sub.add_parser("compare", help="two memories of the same conversations: their tables and the paired "
                                       "difference in fact recall and narrative coverage")
    c.add_argument("--db", required=True, help="memory A's SQLite file")
    c.add_argument("--vs", required=True, help="memory B's SQLite file")
    c.add_argument("--data", required=True, help="the LoCoMo JSON both were built from")
    c.add_argument("--conversations", required=True, help="sample ids, comma-separated (e.g. conv-26)")
    c.add_argument("--sessions", default=None, help="the slice both were built on, e.g. 1-3")
    c.add_argument("--embedder", default=None, help="matcher embedder (default: A's store's, else MiniLM)")
    args = parser.parse_args(argv)
    commands = {"validate": _cmd_validate, "inspect": _cmd_inspect, "compare": _cmd_compare}
    try:
        return commands[args.command](args)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
