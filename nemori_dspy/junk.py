"""What is junk in memory: echoes of the prompts, placeholders and fragments. LLM-free, deterministic.

A small model fills a reply it cannot write with what the prompt showed it: the P_nar ``narrative`` field's
description word for word (``"A faithful third-person account of what happened and what was said, naming the
speakers ... Do not invent facts."``), P_dis's instruction split at its commas (``"relationships"``,
``"preferences"``, ``"plans"``), talk about the task (``"The prediction missed the following facts: Gina's
identity"``) or a placeholder (``"(nothing: memory holds no facts about these people yet)"``, ``"(none)"``).
``junk_reason`` names which; ``is_fragment`` tells a fact with no predicate (``"reading"``, ``"but when I look
after myself"``, ``"since we last chatted"``).

The reference phrases are read from the signature classes themselves (``nemori_dspy.signatures``: every
``dspy.Signature`` and pydantic output model its modules define), lazily, and cached per instruction and
description text: an optimizer that rewrites an instruction gets its new text checked when it passes its
tuned signatures (``junk_reason(text, signatures=[p.signature for _, p in pipeline.named_predictors()])``).

Matching (``_norm``: case-folded ``[\\w']+`` words, punctuation and spacing ignored). A text echoes a reference
phrase (a sentence, a clause between ``, ; : ( ) -`` or bullets, or a whole field description) when

* the phrase is the text's words exactly, or the text's words are a contiguous run of the phrase with at
  least ``MIN_RUN_WORDS`` words (``"a faithful third-person account of what happened"``); or
* ``difflib`` ratio of the two word strings ≥ ``ECHO_RATIO`` (0.85: a few words changed or dropped); or
* at least ``ECHO_COVERAGE`` (80%) of the text's content words (stop words aside, at least 3 of them) occur in
  the phrase, and the text holds no content word outside every reference (a fact about a person names the
  person, a place, a thing: words no instruction has); or
* it speaks of the prompt's own objects: a multi-word field name (``"predicted episode"``, ``"known facts"``,
  ``"existing entries"``) or ``"the prediction"`` (``PROMPT_TERMS``).

A real fact is not flagged: ``"Caroline went to an LGBTQ support group on 7 May 2023."`` shares only
``"went"``-level words with any instruction, and its name, place and date are in none.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from functools import lru_cache
from typing import Any, Iterable

__all__ = ["JUNK_REASONS", "ECHO_RATIO", "ECHO_COVERAGE", "MIN_RUN_WORDS", "PLACEHOLDERS", "PROMPT_TERMS",
           "STOP_WORDS", "junk_reason", "is_fragment", "reference_phrases", "drop_repeated_sentences"]

#: the reasons ``junk_reason`` returns.
JUNK_REASONS = ("instruction_echo", "field_description_echo", "placeholder")
#: ``difflib`` ratio of word strings at or above which a text is a reworded copy of a reference phrase.
ECHO_RATIO = 0.85
#: share of the text's content words found in one reference phrase at or above which it is an echo (when the
#: text holds no word of its own).
ECHO_COVERAGE = 0.8
#: a contiguous run of a reference phrase this long (words) is an echo even as a part of the phrase.
MIN_RUN_WORDS = 4

#: replies that stand for "nothing" (compared as normalised words); ``NOTHING_PREDICTED`` is added lazily.
PLACEHOLDERS = ("(none)", "none", "n/a", "na", "nil", "null", "nothing", "nothing new", "[]", "{}", "-", "--", "...",
                "empty", "unknown", "no facts", "no new facts", "no insights", "no new insights", "no information",
                "no new information", "no information about these people yet", "not applicable", "not available",
                "no relevant information", "no known facts", "none yet", "(empty)")
_PLACEHOLDER_PATTERN = re.compile(
    r"^\W*(?:there (?:is|are) )?(?:no|nothing)\b[^.]{0,60}\b(?:information|facts?|insights?|memory|knowledge|"
    r"details|data|entries)\b[^.]{0,40}$", re.IGNORECASE)

#: words of the prompts' own objects: a fact about people never speaks of them.
PROMPT_TERMS = ("the prediction", "the predicted episode", "the real episode", "the real messages",
                "the episode messages", "the known facts", "the existing entries", "the new insight",
                "the insights", "the cue", "the narrative")

_WORDS = re.compile(r"[\w']+")
_CLAUSE = re.compile(r"[.;:!?()\[\]\n,]|\s-\s|\s—\s|^\s*-\s", re.MULTILINE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")

#: function words (no content): articles, pronouns, auxiliaries, prepositions, conjunctions, common adverbs.
STOP_WORDS = frozenset("""
a an the and or but nor so yet if then than that this these those there here it its it's is are was were be been
being am do does did done doing have has had having will would shall should can could may might must not no
of in on at to for from by with about into onto over under after before during since until till as like
i me my mine you your yours he him his she her hers we us our ours they them their theirs who whom whose which
what when where why how all any each every some such only own same other another more most very just also too
even still ever never always often again once out up down off any one ones s t
""".split())


def _norm(text: str) -> list[str]:
    """Case-folded ``[\\w']+`` words of ``text`` (punctuation, spacing and case ignored)."""
    return _WORDS.findall(text.casefold())


def _content(words: list[str]) -> list[str]:
    return [w for w in words if w not in STOP_WORDS and not w.isdigit()]


# ------------------------------------------------------------------------------------------- references
def _signature_classes() -> list[type]:
    """Every ``dspy.Signature`` subclass and pydantic model defined in the ``nemori_dspy.signatures`` modules."""
    import dspy
    from pydantic import BaseModel

    package = importlib.import_module("nemori_dspy.signatures")
    found: dict[str, type] = {f"{c.__module__}.{c.__qualname__}": c for c in package.SIGNATURES.values()}
    for name in ("episodic", "semantic", "response", "longmemeval"):
        module = importlib.import_module(f"nemori_dspy.signatures.{name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, (dspy.Signature, BaseModel)):
                found.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return list(found.values())


def _texts_of(cls: type) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(instruction, field descriptions, multi-word field names) of a signature class or pydantic model."""
    instruction = getattr(cls, "instructions", None) or ""  # a pydantic model shows the LLM only its fields
    descs, names = [], []
    for name, field in getattr(cls, "model_fields", {}).items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        desc = extra.get("desc") or field.description
        if desc and desc != f"${{{name}}}":
            descs.append(str(desc))
        if "_" in name:
            names.append(name.replace("_", " "))
    return str(instruction), tuple(descs), tuple(names)


def _clauses(text: str) -> list[str]:
    """Sentences, their clauses (split at ``, ; : ( ) -`` and bullets) and the whole text, as word strings."""
    out = [" ".join(_norm(text))]
    for sentence in _SENTENCE.split(text):
        out.append(" ".join(_norm(sentence)))
        out += [" ".join(_norm(c)) for c in _CLAUSE.split(sentence)]
    return [c for c in dict.fromkeys(out) if c]


class _References:
    """Reference phrases of one set of instruction and description texts (``reference_phrases``)."""

    def __init__(self, instructions: tuple[str, ...], descriptions: tuple[str, ...], names: tuple[str, ...]) -> None:
        self.phrases: dict[str, list[str]] = {
            "instruction_echo": [c for t in instructions for c in _clauses(t)],
            "field_description_echo": [c for t in descriptions for c in _clauses(t)],
        }
        self.vocabulary = frozenset(w for t in (*instructions, *descriptions) for w in _norm(t))
        self.terms = tuple(dict.fromkeys([*PROMPT_TERMS, *(n for n in names if " " in n)]))


@lru_cache(maxsize=64)
def _references(instructions: tuple[str, ...], descriptions: tuple[str, ...], names: tuple[str, ...]) -> _References:
    return _References(instructions, descriptions, names)


def reference_phrases(signatures: Iterable[type] | None = None) -> dict[str, list[str]]:
    """The phrases echoes are matched against: ``{"instruction_echo": [...], "field_description_echo": [...]}``,
    each a list of normalised word strings (sentences, clauses and whole texts) of the project's signatures plus
    ``signatures`` (e.g. an optimizer's tuned ones). Cached per instruction/description text."""
    return _lookup(signatures).phrases


def _lookup(signatures: Iterable[type] | None) -> _References:
    classes = _signature_classes() + list(signatures or [])
    texts = [_texts_of(c) for c in classes]
    return _references(tuple(dict.fromkeys(t[0] for t in texts if t[0])),
                       tuple(dict.fromkeys(d for t in texts for d in t[1])),
                       tuple(dict.fromkeys(n for t in texts for n in t[2])))


# ------------------------------------------------------------------------------------------- matching
def _contiguous(small: list[str], big: list[str]) -> bool:
    n = len(small)
    return any(big[i:i + n] == small for i in range(len(big) - n + 1))


def _echoes(words: list[str], phrase: str, vocabulary: frozenset[str]) -> bool:
    """True if the text ``words`` echoes one reference ``phrase`` (rules in the module docstring)."""
    ref = phrase.split()
    if words == ref or (len(words) >= MIN_RUN_WORDS and _contiguous(words, ref)):
        return True
    joined = " ".join(words)
    if 2 * min(len(joined), len(phrase)) >= ECHO_RATIO * (len(joined) + len(phrase)):
        if difflib.SequenceMatcher(None, joined, phrase, autojunk=False).ratio() >= ECHO_RATIO:
            return True
    content = _content(words)
    if len(content) < 3 or any(w not in vocabulary for w in content):
        return False
    inside = set(ref)
    return sum(w in inside for w in content) >= ECHO_COVERAGE * len(content)


@lru_cache(maxsize=1)
def _placeholder_keys() -> frozenset[str]:
    from nemori_dspy.modules.semantic import NOTHING_PREDICTED  # lazy: the semantic module may import this one

    keys = {" ".join(_norm(p)) for p in (*PLACEHOLDERS, NOTHING_PREDICTED)}
    return frozenset(keys | {p.strip() for p in PLACEHOLDERS})


def _is_placeholder(text: str) -> bool:
    stripped = text.strip().strip("\"'`*").strip()
    words = _norm(stripped)
    if stripped in _placeholder_keys() or " ".join(words) in _placeholder_keys() or not words:
        return True
    return len(words) <= 12 and bool(_PLACEHOLDER_PATTERN.match(stripped))


def junk_reason(text: str, signatures: Iterable[type] | None = None) -> str | None:
    """Why ``text`` (a fact, a narrative or a cue a stage produced) is junk, or None when it is not.

    Returns ``"placeholder"`` (e.g. ``NOTHING_PREDICTED``, ``"(none)"``, ``"N/A"``, ``"[]"``, ``"no information
    about these people yet"``, an empty text), ``"instruction_echo"`` (it reproduces a sentence or clause of a
    signature's instruction, or speaks of the prompt's objects: ``"relationships"``, ``"The prediction missed
    the following facts: Gina's identity"``), ``"field_description_echo"`` (it reproduces an ``InputField`` /
    ``OutputField`` description: ``"A faithful third-person account ..."`` is P_nar's ``narrative`` desc in the
    batched signature's model) or None. The rules and thresholds are in the module docstring.

    Args:
        text: the text to check.
        signatures: more signature classes to take phrases from (an optimizer's tuned signatures); the
            project's own (``nemori_dspy.signatures``) are always used.
    """
    if _is_placeholder(text):
        return "placeholder"
    refs = _lookup(signatures)
    reason = _sentence_reason(text, refs)
    if reason is not None:
        return reason
    sentences = [s for s in _SENTENCE.split(text) if _content(_norm(s))]
    if len(sentences) < 2:
        return None
    reasons = [_sentence_reason(s, refs) or (_is_placeholder(s) and "placeholder") for s in sentences]
    flagged = [r for r in reasons if r]
    return max(set(flagged), key=flagged.count) if 2 * len(flagged) > len(sentences) else None


def _sentence_reason(text: str, refs: _References) -> str | None:
    """The echo reason of one text taken whole (no sentence split), or None."""
    words = _norm(text)
    key = " ".join(words)
    for reason in ("field_description_echo", "instruction_echo"):  # a description is also quoted in instructions
        if any(_echoes(words, phrase, refs.vocabulary) for phrase in refs.phrases[reason]):
            return reason
    if any(re.search(rf"\b{re.escape(term)}\b", key) for term in refs.terms):
        return "instruction_echo"
    return None


# ------------------------------------------------------------------------------------------- fragments
_COORDINATORS = frozenset("and but or nor so yet plus also".split())
_SUBORDINATORS = frozenset("when while because although though if unless whereas since as once after before until "
                           "till whenever wherever whether".split())
_PREPOSITIONS = frozenset("about at by for from in into of on onto to with without during around near over under "
                          "through like among between across against toward towards upon via per".split())
_MONTHS = frozenset("january february march april may june july august september october november december".split())
_SUBJECTS = frozenset("i you he she it we they who".split())
_AUXILIARIES = frozenset("""am is are was were be been being has have had do does did will would shall should can
could may might must 's 're 've 'd 'll isn't aren't wasn't weren't hasn't haven't hadn't doesn't don't didn't won't
wouldn't can't cannot couldn't shouldn't""".split())
_ADVERBS = frozenset("last also just still often always never really recently finally usually already even only "
                     "sometimes soon now then again once first".split())
#: common verbs (base form); their -s, -es, -ed, -d and -ing forms count too (plus the irregular pasts below).
_VERBS = frozenset("""like love enjoy want need plan hope live work play paint read write run go make take have feel
think know see visit attend start finish keep own prefer study teach learn help support adopt travel move join win
lose buy sell build bring get give find meet tell say speak talk chat call ask answer show share look watch listen
sing draw cook bake eat drink sleep walk hike swim ride drive fly leave come become begin stay spend try decide
believe wish miss care use open close sign book volunteer practice practise train compete celebrate marry date
raise grow hold wear choose lead hear pay put set sit stand understand wake break fall forget remember receive
send create organise organize host throw catch fight feel express inspire encourage struggle manage enjoy adore
dislike hate fear worry plan mention describe explain admire appreciate recommend consider collect""".split())
_IRREGULAR = frozenset("""went made took got gave saw met began came found felt said told thought bought built brought
ran won lost left kept wrote read sang drew knew grew flew ate drank became sold spent taught caught held heard paid
put set sat stood understood woke wore chose drove rode swam led fell forgot broke sent threw fought meant gone seen
done given taken known grown flown eaten drunk written ridden swum chosen driven worn begun sung drawn""".split())


def _verb_forms(word: str) -> bool:
    if word in _AUXILIARIES or word in _IRREGULAR or word in _VERBS:
        return True
    for suffix, add in (("ies", "y"), ("es", ""), ("s", ""), ("ied", "y"), ("ed", ""), ("ed", "e"), ("d", ""),
                        ("ing", ""), ("ing", "e")):
        if word.endswith(suffix) and word[: len(word) - len(suffix)] + add in _VERBS:
            return True
    return len(word) > 4 and word.endswith("ed")


def _verbs(tokens: list[str]) -> int:
    """How many verb groups there are (a verb right after an auxiliary joins its group): known verb forms, ``-ed`` words, or the word after a subject pronoun or
    a capitalised name (``"Caroline adores"``) when it is not a function word or an adverb."""
    count = 0
    for i, tok in enumerate(tokens):
        low = tok.casefold()
        prev = tokens[i - 1] if i else ""
        after_subject = prev.casefold() in _SUBJECTS or (prev[:1].isupper() and not prev.endswith("'s"))
        chained = prev.casefold() in _AUXILIARIES  # "was tired", "has lived": one verb group
        if not chained and (_verb_forms(low) or (after_subject and low not in STOP_WORDS and low not in _ADVERBS
                                                 and tok[:1].islower())):
            count += 1
    return count


#: what is left of a sentence split at an apostrophe: "s cherished memories" (from "family's"), "t know" (from "don't")
_CONTRACTION_TAIL = re.compile(r"^\s*(?:s|t|ll|re|ve|d|m)\s+[a-z]")


def is_fragment(text: str) -> bool:
    """True if ``text`` has no predicate: it cannot be a fact on its own.

    Rules (in order; a heuristic without a POS tagger, tuned to err towards "a sentence"):

    1. fewer than 3 words: ``"reading"``, ``"relationships"``, ``"Gina's identity"``; or the tail of a word cut at
       its apostrophe (``"s cherished memories"``, ``"s marriage is special"``: a list split at a possessive);
    2. it starts with a coordinating conjunction (``and``, ``but``, ``or``, ``so``, ...): the rest decides
       (``"but when I look after myself"`` → rule 3 on ``"when I look after myself"``);
    3. it starts with a subordinating conjunction (``when``, ``since``, ``because``, ``if``, ...) and has no main
       clause: no comma followed by 3 or more words, and fewer than 2 verbs (``"since we last chatted"``;
       ``"When Caroline was 10, she moved to Sweden"`` is kept; followed by a number or month it is a preposition,
       ``"Since 2020 Caroline has lived in Sweden"``, and rule 4 decides);
    4. it has no verb at all (``"the new puppy from the shelter"``), verbs being auxiliaries, common verbs in any
       form, ``-ed`` words, and the word after a subject pronoun or a capitalised name.
    """
    tokens = _WORDS.findall(text)
    if len(tokens) < 3 or _CONTRACTION_TAIL.match(text):
        return True
    first = tokens[0].casefold()
    if first in _COORDINATORS:
        rest = text[text.casefold().index(first) + len(first):]
        return is_fragment(rest)
    dated = tokens[1].isdigit() or tokens[1].casefold() in _MONTHS  # "since 2020 ...", "after May ...": a preposition
    if first in _SUBORDINATORS and not dated:
        head, comma, tail = text.partition(",")
        has_main = bool(comma) and len(_WORDS.findall(tail)) >= 3
        return not has_main and _verbs(tokens) < 2
    return _verbs(tokens) == 0



def drop_repeated_sentences(text: str) -> tuple[str, int]:
    """``text`` with every sentence that repeats an earlier one removed, and how many were removed.

    A small model decoding greedily can loop, writing the same sentences again until its output cap; the
    repeats state nothing new. Sentences are compared by their words (case and punctuation ignored). When
    anything repeated, an unfinished last sentence (no ``.!?`` or closing quote: the cap cut it) is dropped too
    and counted.

    Returns:
        (the text with the first occurrence of each sentence, in order, joined by single spaces, removed count);
        ``(text, 0)`` unchanged when no sentence repeats.
    """
    parts = [p.strip() for p in _SENTENCE.split(text.strip()) if p.strip()]
    seen: set[tuple[str, ...]] = set()
    kept: list[str] = []
    for part in parts:
        key = tuple(_norm(part))
        if key and key in seen:
            continue
        seen.add(key)
        kept.append(part)
    removed = len(parts) - len(kept)
    if removed == 0:
        return text, 0
    if kept and not kept[-1].rstrip().endswith((".", "!", "?", '"', "\u201d", "'")):
        kept.pop()
        removed += 1
    return " ".join(kept), removed
