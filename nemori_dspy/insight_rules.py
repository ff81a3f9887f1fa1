"""Deterministic rules for insights that are chat lines, copies or questions rather than facts, applied to P_dis /
Nemori-s insights (our addition).

A small distiller often copies chat lines instead of distilling knowledge: ``"Caroline: Hey Mel! Good to
see you!"``, ``"I quit the bakery."``. Dropping every such line left semantic memory empty in six of eight short
conversations, though many carry a fact. The rules, where they are reliable:

* **question**: the insight ends with ``?``, or reports a question (``"Evan asks Sam if he has any recipes for
  grilled dishes."``, ``is_reported_question``): a question states no fact (dropped);
* **chat line**: it starts with ``<speaker>:`` for a speaker of the episode (the message format, never a
  third-person statement);
* **copy**: its text matches one of the episode's messages, or a run of one to three of a message's sentences
  (case, spacing and punctuation aside), with a ``difflib`` ratio of at least ``COPY_RATIO`` *and* names no
  speaker the message does not already name (``"Caroline said: I went to a support group"`` names her and is
  kept as it is; ``"I'm keen on counseling"`` copied from her line is a copy).

A chat line or copy that carries a fact becomes an **attributed fact**, deterministically (``rule_insight``):
``Sam said on 2023-09-15: “I quit the bakery.”``: the message's speaker and date, the copied passage of the message
quoted. One that carries none (``carries_no_fact``: no content word once greetings, interjections, thanks and
reactions (``SOCIAL_WORDS``) and the speakers' names are set aside, or a single content word with no first-person
word: ``"Hi Deb! Good to meet you!"``, ``"Wow, that's great!"``) is dropped as ``no_fact``; a chat line matching no
message of its speaker is dropped as ``chat_line``.

Everything else is kept as it is, including third-person facts that restate a message (``"Caroline went to an
LGBTQ support group on 7 May 2023."`` scores below 0.75 against her line) and first-person statements that
rephrase one. ``not_a_fact`` still names what a rule sees (``question``, ``chat_line``, ``verbatim_copy``).
"""

from __future__ import annotations

import difflib
import functools
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .temporal import annotate_relative_dates, date_mentions, dates_agree, spans_overlap

if TYPE_CHECKING:
    from .types import StoredMessage

__all__ = ["COPY_RATIO", "CHAT_MATCH_RATIO", "ATTRIBUTED_QUOTE_CHARS", "SOCIAL_WORDS", "FIRST_PERSON", "SourceLine",
           "not_a_fact", "is_question", "is_reported_question", "is_chat_line", "is_verbatim_copy", "is_attributed", "message_lines", "dated_message_lines",
           "source_lines", "split_sentences", "content_words", "carries_no_fact", "attributed_fact", "rule_insight",
           "quote_text", "people_named", "first_name_written", "mask_people", "ATTRIBUTION_OVERLAP", "SECOND_PERSON", "misattributed_to", "reattribute", "redate", "SPEECH_VERBS",
           "echoes_demo", "is_demo_echo", "drop_demo_echoes", "DEMO_ECHO_OVERLAP", "demo_texts",
           "reattribute_sentences", "RESTATEMENT_MIN_WORDS", "drop_restatements", "speaks_in_first_person",
           "speaks_to_listener", "is_picture_reaction",
           "quote_first_person", "strip_address", "copied_passage", "no_subject", "word_key", "speaks_of",
           "is_pleasantry", "PREDICTION_ECHO_OVERLAP", "restates_prediction", "pronoun_of", "pronoun_votes",
           "agree_pronouns", "attribute_captions"]

#: difflib ratio at or above which an insight is a copy of a message: a copy with a date resolved
#: ("yesterday" → "on 7 May 2023 (yesterday)") or a name expanded still scores > 0.9, while a fact
#: restating a message in the third person ("Caroline went to an LGBTQ support group on 7 May 2023.") scores
#: below 0.75 against "I went to a LGBTQ support group yesterday and it was so powerful."
COPY_RATIO = 0.85

_WORDS = re.compile(r"[\w']+")
_LINE = re.compile(r"^\s*(?:\d+\.\s*)?(?:\[[^\]]*\]\s*)?([^:\[\]]{1,80}):\s?(.*)$")


def message_lines(rendered: str) -> list[tuple[str, str]]:
    """(speaker, content) of each ``[YYYY-MM-DD HH:MM] speaker: text`` or ``speaker: text`` line of ``rendered``
    (what P_dis was shown, ``formatting.render_messages`` in either ``message_timestamps`` layout); other lines,
    such as a time line ``[YYYY-MM-DD HH:MM]`` on its own, are skipped."""
    return [(m.group(1).strip(), m.group(2)) for m in map(_LINE.match, rendered.splitlines()) if m]


def word_key(text: str) -> str:
    """``text``'s words, case-folded, joined by single spaces (case, spacing and punctuation aside)."""
    return " ".join(_WORDS.findall(text.casefold()))


#: "<Name> asks/asked/wonders [<Name>] if/whether …" or "<Name> asked <Name> what/how/…": a reported question, a fact
#: about the conversation only.
_REPORTED_QUESTION = re.compile(
    r"^\s*[A-Z][\w'’-]+\s+(?:(?:is|was)\s+)?(?:ask(?:s|ed|ing)?|wonder(?:s|ed|ing)?|inquir(?:es|ed|ing|e)|"
    r"(?:wants|wanted)\s+to\s+know)\s+(?:(?:[A-Z][\w'’-]+\s+)?(?:if|whether)|[A-Z][\w'’-]+\s+"
    r"(?:what|which|how|why|when|where|who))\b")


def is_question(insight: str) -> bool:
    """True if ``insight`` ends with a question mark (after closing quotes/brackets) or is a reported question
    (``is_reported_question``)."""
    return insight.rstrip(" \t\"')]}").endswith("?") or is_reported_question(insight)


def is_reported_question(insight: str) -> bool:
    """True if ``insight`` only reports that someone asked something: a name, an asking verb (``asks``, ``asked``,
    ``wonders``, ``inquired``, ``wants to know``), then ``if``/``whether`` (the person asked may come between) or
    the person asked and a wh-word (``"Evan asks Sam if he has any recipes for grilled dishes."``, ``"Evan asked
    Sam what he did on Sunday."``). Such a sentence records a turn of the conversation, not what anyone is, has or
    did (on the conv-49 memory of 2026-12-04, 5 of 95 stored facts had this form). Not matched, since what follows
    may carry a fact: ``"Sam asked about Evan's new job"``, ``"Melanie asked what happened at the group"``,
    ``"Evan asked his doctor if he could ski"``."""
    return bool(_REPORTED_QUESTION.match(insight))


def is_chat_line(insight: str, speakers: set[str]) -> bool:
    """True if ``insight`` starts with ``<speaker>:`` for one of ``speakers`` (case-insensitive)."""
    head, sep, _ = insight.partition(":")
    return bool(sep) and head.strip().strip("[*\"'").casefold() in {s.casefold() for s in speakers}


def _names(key: str, speakers: set[str]) -> int:
    words = key.split()
    return sum(words.count(s) for s in speakers)


def is_verbatim_copy(insight: str, messages: list[tuple[str, str]]) -> bool:
    """True if ``insight`` matches a message's content (``messages``: (speaker, content) pairs) with a ``difflib``
    ratio ≥ ``COPY_RATIO`` and names no speaker (first names, case-insensitive) more often than that message does."""
    key = word_key(insight)
    if not key:
        return False
    speakers = {w for speaker, _ in messages for w in word_key(speaker).split()}
    for _, content in messages:
        other = word_key(content)
        if not other or 2 * min(len(key), len(other)) < COPY_RATIO * (len(key) + len(other)):
            continue  # the ratio cannot reach COPY_RATIO: lengths too different
        m = difflib.SequenceMatcher(None, key, other, autojunk=False)
        if (m.quick_ratio() >= COPY_RATIO and m.ratio() >= COPY_RATIO
                and _names(key, speakers) <= _names(other, speakers)):
            return True
    return False


def not_a_fact(insight: str, rendered_messages: str | list[tuple[str, str]]) -> str | None:
    """Why ``insight`` is not a fact of the episode whose messages P_dis saw as ``rendered_messages`` (one
    ``[YYYY-MM-DD HH:MM] speaker: text`` or ``speaker: text`` line each, or those lines already split by
    ``message_lines``):
    ``"question"``, ``"chat_line"``, ``"verbatim_copy"``, or None when it is kept."""
    if is_question(insight):
        return "question"
    messages = message_lines(rendered_messages) if isinstance(rendered_messages, str) else rendered_messages
    if is_chat_line(insight, {speaker for speaker, _ in messages}):
        return "chat_line"
    if is_verbatim_copy(insight, messages):
        return "verbatim_copy"
    return None


# ------------------------------------------------------------------------------------------------ attribution
#: a message line as the rules read it: (speaker, content, date ``YYYY-MM-DD`` of the message or None).
SourceLine = tuple[str, str, str | None]

#: ``difflib`` ratio from which a chat line's text (``"Sam: …"`` minus ``"Sam:"``) is that speaker's message: lower
#: than ``COPY_RATIO`` because the speaker is already named, so only the wording is compared.
CHAT_MATCH_RATIO = 0.6
#: an attributed fact quotes at most this many characters of the message (cut at a word, marked ``…``): about two
#: sentences, as long as a distilled fact may usefully be.
ATTRIBUTED_QUOTE_CHARS = 300

_TRUNCATED = re.compile(r"\s*…\[truncated \d+ chars\]")  # formatting.clip's mark
_DATE = re.compile(r"\[(\d{4}-\d{2}-\d{2})(?:[ T]\d{2}:\d{2})?\]")
_CLOSING_MARKS = r"[\"')\]»”’]*"  # quotes and brackets that may close a sentence after its . ! ?
_SENTENCE_END = re.compile(rf"(?<=[.!?])({_CLOSING_MARKS})[\s,;]+(?=[A-Z0-9\"“'(\[])")  # group 1: closing marks
_ABBREVIATIONS = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|vs|etc|approx|No|e\.g|i\.e)|\b[A-Z])\.$")

#: words that say nothing about anyone by themselves: function words, greetings, interjections, thanks and
#: reactions (``carries_no_fact``). A word of a chat line not in here, and not a speaker's name, is a content word.
SOCIAL_WORDS = frozenset("""
a an the and or but so if then than that that's this these those there here it it's its is are was were be been being
am do does did doing done have has had having will would can could should shall may might must just really very
too also totally quite pretty such much many lot lots all some any more most even still again ever always yes no
not don't yeah yep nope ok okay sure of to in on at by for with from about as into up out off over oh ah aw aww
wow whoa omg haha hahaha hehe lol hmm hm um uh yay woo hooray hi hello hey hiya howdy yo greetings bye goodbye
cya later soon see seeing talk talking chat chatting catch meet meeting met nice good great cool awesome amazing
wonderful fantastic lovely sweet fun glad happy proud thanks thank thx ty appreciate appreciated welcome congrats
congratulations luck cheers care take sounds sound looks look seems seem means mean agree exactly absolutely
definitely right true totally indeed same too me you your you're yours u ur we us our i i'm my mine myself
he him his she her they them their what how why when where who which news day today tonight night morning
evening afternoon week everyone everybody guys friend dear buddy pal man dude girl both one thing things stuff
again back keep going glad hope hoping wish wishing miss missed love loved xoxo
""".split())
#: first-person words: a one-content-word line with one of them says something about its speaker (``I quit!``).
FIRST_PERSON = frozenset({"i", "i'm", "im", "i've", "i'll", "i'd", "me", "my", "mine", "myself", "we", "we're",
                          "we've", "our", "ours", "us"})


def split_sentences(text: str) -> list[str]:
    """``text`` (spaces collapsed) split into its sentences at ``.``/``!``/``?`` (with any closing quote or bracket
    after it, which stays with its sentence) followed by a space, comma or semicolon and a capital, digit, quote or
    bracket; ``Dr.``, ``e.g.`` and initials do not end one, nor does a sentence inside an open “quote”
    (``Caroline said: “It's great. I love it.”`` is one sentence)."""
    parts = _SENTENCE_END.split(" ".join(text.split()))
    pieces: list[str] = []
    for i in range(0, len(parts), 2):
        piece = parts[i] + (parts[i + 1] if i + 1 < len(parts) else "")
        if pieces and (_ABBREVIATIONS.search(pieces[-1]) or pieces[-1].count("“") > pieces[-1].count("”")):
            pieces[-1] = f"{pieces[-1]} {piece}"
        else:
            pieces.append(piece)
    return [p.strip().rstrip(",;").strip() for p in pieces if p.strip(" ,;")]


def dated_message_lines(rendered: str) -> list[SourceLine]:
    """``message_lines`` of ``rendered`` with each message's date: the ``[YYYY-MM-DD HH:MM]`` on its line, else the
    nearest one above it (``message_timestamps="on_change"``); None before any."""
    out: list[SourceLine] = []
    date = None
    for line in rendered.splitlines():
        stamp = _DATE.search(line)
        if stamp and stamp.start() <= 6:  # a line's own stamp, after at most a "12. " number
            date = stamp.group(1)
        m = _LINE.match(line)
        if m:
            out.append((m.group(1).strip(), m.group(2), date))
    return out


def source_lines(messages: "Sequence[StoredMessage]") -> list[SourceLine]:
    """(speaker, content, ``YYYY-MM-DD`` of ``timestamp`` in its own clock) of each stored message."""
    return [(m.speaker, m.content, f"{m.timestamp:%Y-%m-%d}") for m in messages]


def content_words(text: str, speakers: set[str]) -> list[str]:
    """Words of ``text`` (case-folded) that are not in ``SOCIAL_WORDS``, not a speaker's (first) name and not
    one letter."""
    names = {w for s in speakers for w in word_key(s).split()}
    return [w for w in _lower_words(text)
            if len(w) > 1 and w not in SOCIAL_WORDS and w not in names and not w.isdigit()]


def carries_no_fact(text: str, speakers: set[str]) -> bool:
    """True if a chat line's ``text`` says nothing about anyone: a question, or no content word
    (``content_words``: greetings, thanks, reactions, names only — ``"Hi Deb! Good to meet you!"``, ``"Wow,
    that's great!"``), or one content word and no first-person word (``"Good luck with the exam!"``, ``"Love
    that!"``; ``"I'm pregnant!"`` keeps its fact)."""
    if is_question(text):
        return True
    words = content_words(text, speakers)
    if not words:
        return True
    return len(words) == 1 and not FIRST_PERSON & set(_lower_words(text))


#: a clause reporting a social act between the speakers, and nothing else: thanks, congratulations, compliments,
#: wishes, greetings, goodbyes, "expresses support / gratitude / admiration …" (``is_pleasantry``).
_SOCIAL_ACT = re.compile(
    r"(?:also\s+|then\s+)?(?:thank(?:s|ed)?|congratulat(?:es|ed|e)|compliment(?:s|ed)?|prais(?:es|ed|e)|"
    r"wish(?:es|ed)?|greet(?:s|ed)?|bid(?:s)?\s+farewell|(?:says?|said)\s+(?:goodbye|bye|hello|hi)|"
    r"appreciat(?:es|ed|e)|t(?:akes?|ook)\s+care(?!\s+of\s+(?:his|her|their|its|my|our|the|a|an|some)\b)|"
    r"cheer(?:s|ed)?\s+\w+\s+on|g(?:ives?|ave)\s+\w+\s+a\s+shout|"
    r"(?:says?|said)\s+(?:he|she|they)(?:'ll|’ll|\s+will|\s+would)\s+"
    r"(?:let\s+\w+\s+know|keep\s+\w+\s+(?:posted|updated))|"
    r"express(?:es|ed)?\s+(?:\w+\s+)?(?:gratitude|thanks|appreciation|support|admiration|enthusiasm|excitement|"
    r"happiness|joy|pride|delight)|promise(?:s|d)?\s+to\s+(?:keep\s+\w+\s+posted|see|catch\s+up|talk)|"
    r"looks?\s+forward\s+to\s+(?:seeing|chatting|talking|catching\s+up|hearing))\b")
_ACTOR = re.compile(r"^\s*([A-Z][\w'’-]+)(?:\s+and\s+[A-Z][\w'’-]+)?\s+")
_CLAUSE_SPLIT = re.compile(r"\s*;\s*|,?\s+and\s+(?!(?:his|hers|its|this|theirs|yours|ours)\b)(?=[a-z]+(?:s|ed)\b)")


#: "The photo of … is amazing!", "The painting … is a beautiful image that Caroline found interesting": a picture as
#: the subject, judged and nothing else (``is_picture_reaction``).
_PICTURE_REACTION = re.compile(
    r"^(?:the|this|that|[A-Z][\w'’-]+(?:'s|’s))\s+(?:[\w'’-]+\s+){0,8}?"
    r"(?:photo|image|picture|pic|painting|drawing)s?\b"
    r"[^.!?]*?\b(?:is|are|was|were|looks?|looked|seems?)\s+(?:so\s+|very\s+|really\s+|truly\s+|an?\s+)*"
    r"(?:amazing|beautiful|interesting|promising|great|inspiring|cool|awesome|lovely|stunning|gorgeous|nice|"
    r"wonderful|incredible|fantastic|impressive|cute|adorable|pretty)\b", re.IGNORECASE)


def is_picture_reaction(insight: str) -> bool:
    """True if ``insight`` only judges a picture shared in the chat: its subject is a photo, image, picture or
    painting ("The photo of the family pic from when they met up is amazing!", "The new arrival sign and information
    building image from the agency looks promising.") and its verb says how it looks, in one sentence giving no reason
    or content ("… is interesting because it shows the film set" is kept). Such a sentence is a listener's reaction,
    not knowledge about anyone; what the picture shows is in the episode (its caption is in the messages, the
    narrative tells who shared it)."""
    text = insight.strip()
    return (len(split_sentences(text)) == 1 and not re.search(r"\b(?:because|since|shows?|showing)\b", text, re.I)
            and bool(_PICTURE_REACTION.match(text)))


def is_pleasantry(insight: str, speakers: set[str]) -> bool:
    """True if ``insight`` only reports a social act between the speakers: it opens with a speaker's (first) name
    (or two joined by "and") and every clause (split at ``;`` and at ``and`` before a verb) is a thank-you,
    congratulation, compliment, wish, greeting, goodbye, "expresses support / gratitude /
    admiration …" or a promise to keep in touch (``"Jolene thanks Deborah for kind words."``, ``"Sam thanks Evan
    for the advice and promises to keep him posted."``). Such a sentence is no knowledge about anyone; a clause
    that tells something (``"… and mentions coconut milk ice cream as a new favorite snack"``), "expresses
    interest in …", "agrees to …", "encourages Caroline to continue her education" keep the insight; so does
    taking care *of* someone's own ("Audrey takes care of her dogs"), unlike "Nate took care of Joanna" (a
    "take care" goodbye)."""
    actor = _ACTOR.match(insight)
    names = {word_key(s).split()[0] for s in speakers if word_key(s)}
    if actor is None or word_key(actor.group(1)) not in names:
        return False
    clauses = _CLAUSE_SPLIT.split(insight[actor.end():].strip().rstrip(".!"))
    return all(_SOCIAL_ACT.match(c) for c in clauses if c)


def quote_text(text: str, max_chars: int = ATTRIBUTED_QUOTE_CHARS) -> str:
    """``text`` ready to quote: spaces collapsed, outer quotes dropped, ``.`` added when it has no end punctuation,
    cut at a word to at most ``max_chars`` characters (marked ``…``)."""
    body = " ".join(_TRUNCATED.sub("", text).split()).strip(" \"'“”‘’")
    if len(body) > max_chars:
        body = body[:max_chars].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    elif body and body[-1] not in ".!?…":
        body += "."
    return body


def attributed_fact(speaker: str, date: str | None, text: str) -> str:
    """``Sam said on 2023-09-15: "I quit the bakery."`` (``Sam said: "…"`` without a date)."""
    when = f" on {date}" if date else ""
    return f"{speaker} said{when}: \u201c{quote_text(text)}\u201d"


#: the form ``attributed_fact`` writes: a speaker, "said", an optional ISO date, a quoted passage
_ATTRIBUTED = re.compile(r"^[A-Z][\w'’. -]{0,40} said(?: on \d{4}-\d{2}-\d{2})?: \u201c.+\u201d$", re.DOTALL)


def is_attributed(text: str) -> bool:
    """True if ``text`` is an attributed quote as ``attributed_fact`` writes it (``Sam said on 2023-09-15: “…”``):
    a copied message turned into a fact with its speaker and date, not a bare copy."""
    return bool(_ATTRIBUTED.match(text.strip()))


def _ratio(a: str, b: str) -> float:
    if not a or not b or 2 * min(len(a), len(b)) < 0.5 * (len(a) + len(b)):
        return 0.0  # lengths too different for any ratio these rules use
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _passages(content: str) -> list[str]:
    """What of a message an insight may copy: the whole content, and each run of one to three of its sentences."""
    sents = split_sentences(_TRUNCATED.sub("", content))
    runs = [" ".join(sents[i:j]) for i in range(len(sents)) for j in range(i + 1, min(i + 4, len(sents) + 1))]
    return list(dict.fromkeys([_TRUNCATED.sub("", content).strip(), *runs]))


def _match(text: str, lines: list[SourceLine], speaker: str | None, floor: float) -> tuple[SourceLine, str] | None:
    """(message line, the passage of it ``text`` copies) for the best ``difflib`` match ≥ ``floor`` of ``text``
    against ``_passages`` of each line (only ``speaker``'s lines when given; a passage containing ``text`` counts
    as 1.0 then), naming no speaker the passage does not; on a tie the shorter passage, then the earlier line, wins.
    None if none reaches ``floor``."""
    key = word_key(text)
    if not key:
        return None
    names = {w for who, _, _ in lines for w in word_key(who).split()}
    best: tuple[SourceLine, str] | None = None
    best_ratio = 0.0
    for line in lines:
        if speaker is not None and line[0].casefold() != speaker.casefold():
            continue
        for passage in _passages(line[1]):
            other = word_key(passage)
            r = 1.0 if speaker is not None and key in other else _ratio(key, other)
            shorter = best is not None and r == best_ratio and len(passage) < len(best[1])
            if (r > best_ratio or shorter) and r >= floor and _names(key, names) <= _names(other, names):
                best, best_ratio = (line, passage), r
    return best


def copied_passage(text: str, lines: list[SourceLine], speaker: str | None = None,
                   floor: float = COPY_RATIO) -> tuple[SourceLine, str] | None:
    """(message line, the passage of it ``text`` copies), or None: the best ``difflib`` match ≥ ``floor`` of
    ``text`` against each message and each run of one to three of its sentences (only ``speaker``'s messages when
    given), as ``rule_insight`` finds a copy."""
    return _match(text, lines, speaker, floor)


def rule_insight(insight: str, lines: list[SourceLine]) -> tuple[str | None, str]:
    """What to store for one P_dis / Nemori-s ``insight`` of an episode whose messages are ``lines``:
    ``(text, outcome)``.

    * ``(insight, "kept")``: a statement that is no chat line and no copy, stored as it is (a third-person fact
      restating a message, ``"Caroline went to an LGBTQ support group on 7 May 2023."``, is kept as it is);
    * ``(fact, "reattributed")``: such a statement crediting one speaker with what another said of themselves
      (``misattributed_to``), with the names put right (``reattribute``);
    * ``(fact, "attributed")``: a chat line (``"Sam: I quit the bakery"``, its text a ``difflib`` match ≥
      ``CHAT_MATCH_RATIO`` of a message of Sam's) or a copy of a message (the whole message or a run of one to
      three of its sentences, ratio ≥ ``COPY_RATIO``, naming no speaker the message does not) becomes
      ``Sam said on 2023-09-15: “I quit the bakery.”``: the message's speaker and date, and the copied passage of
      the message itself quoted (``attributed_fact``), so two copies of one message give one fact; so does a
      statement speaking in the first person outside quotation marks (``speaks_in_first_person``) whose text
      matches a message at ``CHAT_MATCH_RATIO``: "Gina used to compete in a few dance competitions and shows - my
      fav memory was when my team won first place …" (half third person, half Gina's line) becomes Gina's quote;
    * ``(None, reason)``: dropped: ``"question"`` (ends with ``?``), ``"no_fact"`` (a chat line or copy that
      ``carries_no_fact``: greetings, thanks, reactions), ``"chat_line"`` (a chat line matching no message of
      its speaker: not something anyone said), ``"pleasantry"`` (a sentence that only reports a social act between
      the speakers, ``is_pleasantry``: "Jolene thanks Deborah for kind words."), ``"first_person"`` (a statement
      speaking in the first person that matches no message: nobody can tell whose "my" it is),
      ``"picture_reaction"`` (a picture judged and nothing else, ``is_picture_reaction``: "The photo of the family
      pic from when they met up is amazing!").

    A statement saying "you" outside quotation marks (``speaks_to_listener``) that copies a message, its names left
    out, at ``CHAT_MATCH_RATIO`` (``_second_person_match``) is attributed the same way, to the message's speaker:
    "Joanna made a dairy-free chocolate cake with berries on it the other day, maybe you would like that!" is
    Nate's line with the wrong name put in front; unmatched ("… things that can bring you joy") it is kept.
    """
    if is_question(insight):
        return None, "question"
    speakers = {speaker for speaker, _, _ in lines}
    if is_pleasantry(insight, speakers):
        return None, "pleasantry"
    if is_picture_reaction(insight):
        return None, "picture_reaction"
    if is_chat_line(insight, speakers):
        head, _, text = insight.partition(":")
        speaker = next(s for s in speakers if s.casefold() == head.strip().strip("[*\"'").casefold())
        found = _match(text, lines, speaker, CHAT_MATCH_RATIO)
        if found is None:
            return None, "chat_line"
    else:
        found = _match(insight, lines, None, COPY_RATIO)
        if found is None and speaks_in_first_person(insight):
            found = _first_person_match(insight, lines)
            if found is None:
                return None, "first_person"
        if found is None and speaks_to_listener(insight):
            found = _second_person_match(insight, lines)
        if found is None:
            text, changed = reattribute(insight, lines)
            return text, "reattributed" if changed else "kept"
    (speaker, _, date), passage = found
    if carries_no_fact(passage, speakers):
        return None, "no_fact"
    return attributed_fact(speaker, date, passage), "attributed"


def _without_name(text: str, who: str) -> str:
    """``text`` with each mention of the first name ``who`` (case-folded, any case in the text) and its possessive
    blanked: what a fact says, without whom it credits."""
    return re.sub(rf"\b{re.escape(who)}(?:['’]s)?\b", " ", text, flags=re.IGNORECASE)


def _first_person_match(insight: str, lines: list[SourceLine]) -> tuple[SourceLine, str] | None:
    """(message line, passage) an insight speaking in the first person copies, as ``_match`` finds it at
    ``CHAT_MATCH_RATIO``: against every message when the insight names no speaker, against the named speaker's own
    messages, that name (and its possessive) left out, when it names one ("Gina used to compete … - my fav memory
    …" against Gina's "I used to compete … - my fav memory …"); None when it names two or more, or nothing
    matches."""
    first = _first_names(lines)
    named = people_named(insight, set(first))
    if len(named) > 1:
        return None
    if not named:
        return _match(insight, lines, None, CHAT_MATCH_RATIO)
    (who,) = named
    bare = _without_name(insight, who)
    return _match(bare, [line for line in lines if _speaker_key(line[0]) == who], None, CHAT_MATCH_RATIO)


def speaks_to_listener(text: str) -> bool:
    """Whether ``text`` says "you", "your"… (``SECOND_PERSON``) outside its quotation marks: a fact about someone
    says "he" or "she"; a chat line addressed to its listener says "you"."""
    return bool(SECOND_PERSON & set(_lower_words(_QUOTED.sub(" ", text))))


def _second_person_match(insight: str, lines: list[SourceLine]) -> tuple[SourceLine, str] | None:
    """(message line, passage) an insight saying "you" copies: ``_match`` at ``CHAT_MATCH_RATIO`` of the insight with
    the speakers' first names (and possessives) left out, against every speaker's messages, since the name a small
    model put in front may be the wrong one. None when nothing matches."""
    first = _first_names(lines)
    bare = insight
    for who in people_named(insight, set(first)):
        bare = _without_name(bare, who)
    return _match(bare, lines, None, CHAT_MATCH_RATIO)


# ------------------------------------------------------------------------------------------------ speaker check
#: share of an insight's content words a message must hold to be the message the insight restates
#: (``misattributed_to``); the insight's named person's best message must hold less than half of that share.
ATTRIBUTION_OVERLAP = 0.5
#: second-person words: a message saying more "you" than "I" is about its listener, not its speaker.
SECOND_PERSON = frozenset({"you", "you're", "youre", "you've", "you'll", "you'd", "your", "yours", "yourself", "u",
                           "ur"})
_SUFFIXES = ("ing", "ed", "es", "s")
#: verbs that report an act of speaking ("Evan suggested seltzer", "Sam asked about his diet"): a sentence built on
#: one credits the speaker with *saying* it, so a second-person source message ("Have you tried seltzer?") is that
#: speaker's own words, not a fact about the listener.
SPEECH_VERBS = frozenset({"suggest", "suggested", "suggests", "ask", "asked", "asks", "recommend", "recommended",
                          "recommends", "encourage", "encouraged", "encourages", "advise", "advised", "advises",
                          "tell", "told", "tells", "say", "said", "says", "wonder", "wondered", "wonders", "offer",
                          "offered", "offers", "compliment", "complimented", "compliments", "praise", "praised",
                          "praises", "thank", "thanked", "thanks", "congratulate", "congratulated", "congratulates",
                          "invite", "invited", "invites", "urge", "urged", "urges", "remind", "reminded", "reminds",
                          "reassure", "reassured", "reassures", "propose", "proposed", "proposes", "warn", "warned",
                          "warns", "inquire", "inquired", "inquires", "question", "questioned", "questions",
                          "mention", "mentioned", "mentions", "reply", "replied", "replies", "respond", "responded",
                          "responds", "express", "expressed", "expresses", "admire", "admired", "admires",
                          "share", "shared", "shares", "show", "showed", "shows", "send", "sent", "sends"})
#: "<A> told <B> that …": the teller, then the listener (what follows is the teller's report)
_TELLER = re.compile(r"\b([A-Z][\w'’-]+)\s+(?:told|informed|asked|reminded|assured|updated|warned|"
                     r"(?:said|mentioned|explained|admitted|confided|revealed)\s+to)\s+([A-Z][\w'’-]+)\b")
#: a line quoting its speaker, "Evan: Woah, such a view!"
_QUOTE = re.compile(r"^\s*[A-Z][\w'’. -]{0,40}:\s")
#: words that may open a greeting before the name it addresses ("Hey Sam!", "Thanks, Evan,")
_GREETING = (r"(?:hey|hi|hello|hiya|yo|oh|wo+w|woah|whoa|woo+hoo+|aw+|thanks|thank you|dear|congrats|ha(?:ha)*|yeah|"
             r"yes|yep|yup|yay|ok|okay|sure|cool|nice|great|awesome|sorry|omg|lol|well|hmm+)")


def _without_address(text: str, name: str) -> str:
    """``text`` without ``name`` (a case-folded first name) where it is only the person spoken to: at the start of
    a sentence, alone or after a greeting and followed by ``!``/``,``/``.`` ("Hey Sam! I got back …"), or at the end
    of a clause after a comma ("Great to hear, Sam!"). A name used any other way is kept."""
    n = re.escape(name)
    text = re.sub(rf"(^|[.!?]\s+)(?:{_GREETING}\W*\s*)?\b{n}\b\s*[!,.]", r"\1", text, flags=re.IGNORECASE)
    return re.sub(rf",\s*\b{n}\b(?=\s*[!?.]|\s*$)", "", text, flags=re.IGNORECASE)


def strip_address(text: str, names: set[str]) -> str:
    """``text`` without the ``names`` (case-folded first names) used only to address the listener ("Hey Sam! I got
    back …" → "I got back …"; ``_without_address``), so a message names only the people it speaks of."""
    for name in names:
        text = _without_address(text, name)
    return text


def _stem(word: str) -> str:
    """Crude suffix stripping (``-ing``, ``-ed``, ``-es``, ``-s``) so "adopting" meets "adopted"; ``-ies``/``-ied``
    become ``-y`` so "agencies" meets "agency"."""
    if len(word) > 4 and word.endswith(("ies", "ied")):
        return word[:-3] + "y"
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _first_names(lines: list[SourceLine]) -> dict[str, str]:
    """Case-folded first name → the speaker's first name as written, for every speaker of ``lines``."""
    return {_speaker_key(who): who.split()[0] for who, _, _ in lines if who.strip()}


#: Opening words of a sentence that leans on one before it for its subject.
_BARE_PRONOUNS = frozenset({"they", "he", "she", "it", "we", "both", "this", "that", "these", "those"})


def no_subject(fact: str, lines: list[SourceLine]) -> bool:
    """True if ``fact`` opens with a bare pronoun ("They share stories, advice and encouragement.") and names none
    of the speakers of ``lines``: it is not self-contained (P_dis: "one self-contained sentence naming the person",
    §3.3.2), and read alone later nobody knows who it is about. Seen with the 1.5B distiller on runs of small talk."""
    words = re.findall(r"[\w'’]+", fact)
    return bool(words) and words[0].casefold() in _BARE_PRONOUNS and not people_named(fact, set(_first_names(lines)))


_NAME_WORD = re.compile(r"[\w'’]+")


def _named(word: str, speakers: set[str]) -> tuple[str, str] | None:
    """``(speaker, possessive tail)`` when ``word`` names one of ``speakers`` ("Mel's" → ("mel", "'s"),
    "MEL’S" → ("mel", "’S")), else None."""
    for tail in ("'s", "’s", ""):
        if word.casefold().endswith(tail) and (name := word[:len(word) - len(tail)].casefold()) in speakers:
            return name, word[len(word) - len(tail):]
    return None


def people_named(text: str, speakers: set[str]) -> set[str]:
    """The ``speakers`` (case-folded first names) that ``text`` names, possessives included ("Mel's" → "mel")."""
    return {hit[0] for w in _NAME_WORD.findall(text) if (hit := _named(w, speakers))}


def first_name_written(text: str, speakers: set[str]) -> str | None:
    """The first word of ``text`` naming one of ``speakers`` (case-folded first names), as written and without
    a possessive tail ("… Mel's dog" → "Mel"), or None."""
    for w in _NAME_WORD.findall(text):
        if hit := _named(w, speakers):
            return w[:len(w) - len(hit[1])]
    return None


def mask_people(text: str, speakers: set[str], placeholder: str = "someone") -> str:
    """``text`` with every word naming one of ``speakers`` (case-folded first names; possessives kept: "Mel's" →
    "someone's") replaced by ``placeholder``, so an embedding compares what a fact says, not whom it names."""
    def swap(m: re.Match) -> str:
        hit = _named(m.group(0), speakers)
        return m.group(0) if hit is None else placeholder + hit[1]
    return _NAME_WORD.sub(swap, text)


def _lower_words(text: str) -> list[str]:
    """Case-folded words of ``text``, curly apostrophes made straight (so "I’m" is "i'm")."""
    return _WORDS.findall(text.casefold().replace("’", "'"))


def _person_counts(text: str) -> tuple[int, int]:
    words = _lower_words(text)
    return sum(w in FIRST_PERSON for w in words), sum(w in SECOND_PERSON for w in words)


def misattributed_to(insight: str, lines: list[SourceLine], second_person: bool = True) -> tuple[str, str] | None:
    """``(named, meant)`` (first names as written) when ``insight`` credits one speaker with what is another's,
    else None.

    A small distiller confuses who is who in a chat: it writes "Melanie is looking into adoption agencies" from
    Caroline's "I'm looking into adoption agencies", or "Melanie has such a caring heart" from Melanie's own "You
    have such a caring heart", or "Sam told Evan that he drove his new Prius to the Rockies" from Evan's "I took my
    new Prius to the Rockies". An insight naming both speakers is checked only in that "<A> told <B> that …" form
    (``_teller_swapped``: ``(A, B)`` when what follows restates B's own words; the names are then swapped) and in
    "<A> shared a photo of … with <B>" (``_sharer_swapped``: B's caption, swapped the same way). Otherwise
    the insight must name exactly one speaker of the episode and a message must hold ≥
    ``ATTRIBUTION_OVERLAP`` of its content words, and at least two of them (crudely stemmed; greetings, reactions and
    names aside). Then:

    * **first person**: the message is *another* speaker's, speaks of its speaker (more first- than second-person
      words in its sentences holding the insight's words: ``speaks_of``), does not name the insight's person (a
      name used only to address them, "Hey Sam! I got …", does not count: ``_without_address``), and every message
      of the named speaker that is not about their listener holds less than half of its share ("Is this your own
      painting?" does not make the painting its asker's) → the message's speaker is meant;
    * **second person**: the message is the named speaker's own, holds more of the insight than any other
      speaker's, and speaks of its listener (more second- than first-person words), in a chat of exactly two
      speakers, and the insight itself says no "you" and reports no act of speaking (``SPEECH_VERBS``: "Evan
      suggested seltzer" from Evan's "Have you tried seltzer?" is right as it stands) → the listener is meant.

    When several messages of a speaker hold the top share, every one must speak as the rule needs. A line quoting
    its speaker ("Evan: Woah, such a view!") is a report of speech too. ``second_person=False`` runs the first rule
    only: a narrative is mostly reports of who said or showed what, which the second rule would misread.

    Anything less clear leaves the insight as it is: a message about its listener ("Your kids are so sweet, Mel!")
    never moves a fact to its speaker."""
    first = _first_names(lines)
    named = people_named(insight, set(first))
    if len(first) < 2 or not named:
        return None
    if len(named) == 2:
        return _teller_swapped(insight, lines, first) or _sharer_swapped(insight, lines, first, named)
    if len(named) != 1:
        return None
    (who,) = named
    words = {_stem(w) for w in content_words(insight, set(first))}
    if len(words) < 2:
        return None
    best = _best_shares(words, lines, first)
    own, own_tops = best.get(who, (0.0, []))
    others = sorted(((share, key, tops) for key, (share, tops) in best.items() if key != who), reverse=True)
    if not others:
        return None
    share, key, tops = others[0]
    names = set(first)
    if (_clear(share, len(words))
            and _best_shares(words, lines, first, about_self=True).get(who, (0.0, []))[0] < share / 2
            and all(speaks_of(c, words, names) == "self" or _shows(insight, who, c, words, names) for c in tops)
            and not any(who in people_named(_without_address(c, who), {who}) for c in tops)):
        return first[who], first[key]
    if (second_person and _clear(own, len(words)) and own > share and len(first) == 2
            and all(speaks_of(c, words, names) == "listener" for c in own_tops) and not _QUOTE.match(insight)
            and not (SECOND_PERSON | SPEECH_VERBS) & set(_lower_words(insight))):
        return first[who], first[key]
    if second_person:
        return _paraphrased_from(insight, who, lines, first)
    return None


def _paraphrased_from(insight: str, who: str, lines: list[SourceLine], first: dict[str, str]
                      ) -> tuple[str, str] | None:
    """``(named, meant)`` when ``insight``, its one speaker's name left out, is a close paraphrase of another
    speaker's first-person passage (``difflib`` ratio ≥ ``CHAT_MATCH_RATIO``, ``_match``) and no passage of the
    named speaker's comes within ``PARAPHRASE_MARGIN`` of it: "Melanie is off to go research." is Caroline's "Well,
    I'm off to go do some research." (0.71; Melanie's "I'm off to go swimming with the kids." 0.49), which the
    content-word shares cannot tell apart at two words. A message naming the insight's person ("I heard Sam got
    back from a trip …") keeps the fact with them."""
    bare = _without_name(insight, who)
    found = _match(bare, [ln for ln in lines if _speaker_key(ln[0]) != who], None, CHAT_MATCH_RATIO)
    if found is None:
        return None
    (speaker, content, _), passage = found
    if speaks_of(passage) != "self" or who in people_named(_without_address(content, who), {who}):
        return None
    key = word_key(bare)
    theirs = _ratio(key, word_key(passage))
    own = max((_ratio(key, word_key(p)) for ln in lines if _speaker_key(ln[0]) == who for p in _passages(ln[1])),
              default=0.0)
    if own > theirs - PARAPHRASE_MARGIN:
        return None
    return first[who], first[_speaker_key(speaker)]


#: how much closer (``difflib`` ratio) another speaker's passage must be to an insight than any of the named
#: speaker's own for ``_paraphrased_from`` to move it.
PARAPHRASE_MARGIN = 0.15


#: an image turn as a message carries it (``eval.locomo`` renders LoCoMo's image turns so): its caption in group 1.
_CAPTION = re.compile(r"\[shares an image: ([^\]]*)\]")
#: "<who> shares a picture": the sharing verb right after the person it credits (``{who}``), then a picture word.
_SHARE_VERB = (r"\b{who}(?:'s|’s)?\s+(?:also\s+|then\s+|\w+ly\s+)?"
               r"(?:share[sd]?|show(?:s|ed)?|post(?:s|ed)?|sen[dt]s?|give[sn]?|gave)\b")
_SHARING = _SHARE_VERB + r"[^.;]*?\b(?:image|photo|picture|pic|photograph|snapshot)s?\b"
#: "<who>'s living room photo": a picture called the person's (``_shows`` reads it as "<who> shared a photo").
_OWNED_PICTURE = r"\b{who}(?:'s|’s)\s+(?:[\w-]+\s+){{0,4}}?(?:image|photo|picture|pic|photograph|snapshot)s?\b"


#: a sentence's end: ``.``/``!``/``?`` with any closing quotes or brackets after it (those ``split_sentences`` keeps)
_ENDS_SENTENCE = re.compile(rf"[.!?]{_CLOSING_MARKS}$")


def attribute_captions(text: str, lines: list[SourceLine]) -> tuple[str, int]:
    """``text`` (a narrative) with every bare ``[shares an image: X]`` tag, the chat's image mark copied into the
    prose ("… felt hopeful. [shares an image: a sign for a new arrival] On 25 May …"), taken out and told after the
    sentence it stood in (``split_sentences``) as one naming whose picture it is: "Caroline shared an image: a sign
    for a new arrival." The sharer is the speaker of the first of ``lines`` (``(speaker, content, date)``) whose content holds that exact
    tag; a tag no message holds is dropped.

    Returns:
        (the text, how many tags were moved or dropped); ``(text, 0)`` when it holds no tag.
    """
    n = 0
    while m := _CAPTION.search(text):
        n += 1
        before, after = text[:m.start()].rstrip(), text[m.end():].lstrip()
        speaker = next((sp for sp, content, _ in lines if m.group(0) in content), None)
        if speaker is None:
            text = f"{before} {after}".strip()
            continue
        told = f"{speaker} shared an image: {m.group(1).strip().rstrip('.!?')}."
        if not before or _ENDS_SENTENCE.search(before):
            text = " ".join(p for p in (before, told, after) if p)
            continue
        rest = split_sentences(after) or [""]
        sentence = f"{before} {rest[0]}".strip()
        if not _ENDS_SENTENCE.search(sentence):
            sentence += "."
        text = " ".join(p for p in (sentence, told, *rest[1:]) if p)
    return (re.sub(r"\s+([.,;:!?])", r"\1", text), n) if n else (text, 0)


def _shows(insight: str, who: str, content: str, words: set[str], names: set[str]) -> bool:
    """True when ``insight`` says that ``who`` (case-folded first name) shared a picture and a caption of
    ``content`` (``[shares an image: …]``) holds what it says (``_clear``): an image a message shares is its
    speaker's, though a caption speaks of no one ("Caroline shares an image of a man and a little girl by a
    waterfall" from Melanie's picture); so is a picture called ``who``'s ("John's living room photo is about a
    couch", ``_OWNED_PICTURE``). A sentence whose sharer is a pronoun ("She shared …, which Melanie liked")
    does not count."""
    forms = (_SHARING, _OWNED_PICTURE)
    if not any(re.search(form.format(who=re.escape(who)), insight, re.IGNORECASE) for form in forms):
        return False
    return _clear(_caption_share(words, content, names), len(words))


def _caption_share(words: set[str], content: str, names: set[str]) -> float:
    """The share of ``words`` (stemmed content words) the ``[shares an image: …]`` captions of ``content`` hold
    (0.0 when it has none)."""
    caption = " ".join(_CAPTION.findall(content))
    return len(words & {_stem(w) for w in content_words(caption, names)}) / len(words) if caption else 0.0


def _speaker_key(speaker: str) -> str:
    """A message speaker's case-folded first name ("" for none): the key ``_best_shares`` and ``_sharer_swapped``
    group messages by."""
    return speaker.split()[0].casefold() if speaker.strip() else ""


#: stems that say a picture was shared but not which one (``_sharer_swapped`` leaves them out of what it matches).
_PICTURE_STEMS = frozenset({"shar", "share", "show", "post", "send", "sent", "image", "imag", "photo", "picture",
                            "pictur", "pic", "photograph", "snapshot"})


def _sharer_swapped(insight: str, lines: list[SourceLine], first: dict[str, str], named: set[str]
                    ) -> tuple[str, str] | None:
    """``(sharer, meant)`` when ``insight`` names both speakers and says the one named right before the sharing verb
    shared something (``_SHARE_VERB``, whatever the object: P_nar's cue "Caroline shares a painting of a sunset over
    a lake with Melanie" says no "photo"; not "<B> and <A> shared") whose caption is the other's: a caption of the
    other's messages holds the insight's words clearly (``_clear``) and none of the named sharer's holds half as many. The
    two names are then swapped: "Caroline shared a photo of a painting of a sunset over a lake with Melanie" of
    Melanie's ``[shares an image: a photo of a painting of a sunset over a lake]`` (Caroline's own caption, "a photo
    of a dog walking past a wall with a painting of a woman", shares "painting" only: the words saying that a picture
    was shared, ``_PICTURE_STEMS``, are left out). None otherwise."""
    words = {_stem(w) for w in content_words(insight, set(first))} - _PICTURE_STEMS
    if len(words) < 2:
        return None
    for who in named:
        m = re.search(_SHARE_VERB.format(who=re.escape(who)), insight, re.IGNORECASE)
        if m is None or re.search(r"\band\s+$", insight[:m.start()], re.IGNORECASE):
            continue
        (other,) = named - {who}
        held: dict[str, float] = {}
        for speaker, content, _ in lines:
            key = _speaker_key(speaker)
            held[key] = max(held.get(key, 0.0), _caption_share(words, content, set(first)))
        theirs, own = held.get(other, 0.0), held.get(who, 0.0)
        if _clear(theirs, len(words)) and own < theirs / 2:
            return first[who], first[other]
    return None


def _best_shares(words: set[str], lines: list[SourceLine], first: dict[str, str], about_self: bool = False
                 ) -> dict[str, tuple[float, list[str]]]:
    """Speaker (case-folded first name) → (the largest share of ``words`` one of their messages holds, every
    message of theirs holding it). ``about_self``: leave out messages whose part holding ``words`` speaks of the
    listener ("Is this your own painting?" is no sign the painting is its speaker's), or, where that part says
    neither, whose whole text does ("You're doing something amazing! Creating a family for those kids is so
    lovely."); a message sharing an image is judged by its part alone (the picture is its speaker's)."""
    best: dict[str, tuple[float, list[str]]] = {}
    for speaker, content, _ in lines:
        key = _speaker_key(speaker)
        if about_self and speaks_of(content, words, set(first),
                                    whole_on_tie=not _CAPTION.search(content)) == "listener":
            continue
        share = len(words & {_stem(w) for w in content_words(content, set(first))}) / len(words)
        top, tops = best.get(key, (-1.0, []))
        best[key] = (share, [content]) if share > top else (top, [*tops, content]) if share == top else (top, tops)
    return best


def _teller_swapped(insight: str, lines: list[SourceLine], first: dict[str, str]) -> tuple[str, str] | None:
    """``(teller, meant)`` when ``insight`` reads "<A> told <B> that …" (or asked, informed, said to, mentioned
    to …) and what follows restates *B*'s own first-person message clearly (``_clear``; B's top messages speak of
    themselves, and A's best message holds less than half as much): the two names are swapped. None otherwise."""
    m = _TELLER.search(insight)
    if m is None:
        return None
    teller, listener = m.group(1).casefold(), m.group(2).casefold()
    if teller not in first or listener not in first or teller == listener:
        return None
    words = {_stem(w) for w in content_words(insight[m.end():], set(first))}
    if len(words) < 2:
        return None
    best = _best_shares(words, lines, first)
    own = best.get(teller, (0.0, []))[0]
    share, tops = best.get(listener, (0.0, []))
    if _clear(share, len(words)) and own < share / 2 and all(speaks_of(c, words, set(first)) == "self" for c in tops):
        return first[teller], first[listener]
    return None


def _clear(share: float, n_words: int) -> bool:
    """A message holding ``share`` of an insight's ``n_words`` content words is the one it restates."""
    return share >= ATTRIBUTION_OVERLAP and round(share * n_words) >= 2


def speaks_of(content: str, words: set[str] | None = None, names: set[str] = frozenset(),
              whole_on_tie: bool = False) -> str | None:
    """``"self"`` (more first- than second-person words), ``"listener"`` (the reverse) or None (a tie), counted
    over the sentences of ``content`` that hold one of ``words`` (stemmed content words; all sentences when none
    does or ``words`` is None): in "Hey Sam! I'm swamped with work. What's up with you?" the part about work
    speaks of its speaker, though the whole message says "you" twice. ``names``: case-folded first names, not
    content words. ``whole_on_tie``: when those sentences tie, count the whole message instead ("You're doing
    something amazing! Creating a family for those kids is so lovely." is about the listener)."""
    part = content
    if words:
        held = [s for s in split_sentences(content) if words & {_stem(w) for w in content_words(s, names)}]
        part = " ".join(held) or content
    mine, yours = _person_counts(part)
    if whole_on_tie and mine == yours and part != content:
        mine, yours = _person_counts(content)
    return "self" if mine > yours else "listener" if yours > mine else None


def reattribute(insight: str, lines: list[SourceLine], second_person: bool = True) -> tuple[str, bool]:
    """``(text, changed)``: ``insight`` with the speaker it wrongly credits (``misattributed_to``) replaced by the one
    meant, possessives kept ("Melanie's" → "Caroline's"); unchanged when the rule does not fire."""
    found = misattributed_to(insight, lines, second_person)
    if found is None:
        return insight, False
    named, speaker = found
    if speaker.casefold() in people_named(insight, {speaker.casefold()}):  # "A told B …" the wrong way round: swap
        swap = {named.casefold(): speaker, speaker.casefold(): named}
        return re.sub(rf"\b({re.escape(named)}|{re.escape(speaker)})\b", lambda m: swap[m.group(1).casefold()],
                      insight, flags=re.IGNORECASE), True
    return re.sub(rf"\b{re.escape(named)}\b", speaker, insight, flags=re.IGNORECASE), True


def _without_dates(text: str) -> str:
    """``text`` with each date it states (``temporal.date_mentions``) blanked: what it says, not when."""
    for start, end, _ in reversed(date_mentions(text)):
        text = text[:start] + " " + text[end:]
    return text


def _telling(insight: str, lines: list[SourceLine]) -> tuple[str, datetime] | None:
    """(the message text, relative dates resolved, and its send time) of the one dated message holding the most
    of ``insight``'s content words (dates aside), when it holds at least half of them and no other holds as many."""
    speakers = {speaker for speaker, _, _ in lines}
    words = {_stem(w) for w in content_words(_without_dates(insight), speakers)}
    if len(words) < 2:
        return None
    scored = sorted(((len(words & {_stem(w) for w in content_words(content, speakers)}) / len(words), content, day)
                     for _, content, day in lines if day), key=lambda x: -x[0])
    if not scored or scored[0][0] < 0.5 or (len(scored) > 1 and scored[1][0] == scored[0][0]):
        return None
    _, content, day = scored[0]
    when = datetime.fromisoformat(day)
    return (content if date_mentions(content, when.year) else annotate_relative_dates(content, when)), when


def redate(insight: str, lines: list[SourceLine]) -> tuple[str, bool]:
    """``(text, changed)``: ``insight`` with the date it gives its event put right from the message that tells the
    event, when that message dates it otherwise (``temporal.dates_agree``): "Melanie got married on 8 June 2023"
    from "5 years already! … my wedding in 2018 (5 years ago)" sent 9 June 2023 → "Melanie got married in 2018".

    The telling message is the one dated message holding the most of the insight's content words (at least half,
    no tie); it must state exactly one date, which replaces each of the insight's dates it does not overlap, with
    "on" for a day and "in" for a week, month or year. Unchanged otherwise (no date in the insight, no clear
    telling message, the dates agree, or the message states none or several)."""
    mentions = date_mentions(insight)
    if not mentions or not lines:
        return insight, False
    found = _telling(insight, lines)
    if found is None:
        return insight, False
    text, when = found
    if dates_agree(insight, text, f"{when:%B %Y}"):
        return insight, False
    stated = date_mentions(text, when.year)
    if len({span for _, _, span in stated}) != 1:
        return insight, False
    start0, end0, right = stated[0]
    phrase = text[start0:end0]
    out = insight
    for start, end, span in reversed(mentions):
        if spans_overlap(span, right):
            continue
        head = re.sub(r"\b(?:on|in|during)\s+$", "", out[:start])
        prep = "" if phrase.lower().startswith("the week") and head.rstrip().endswith(("in", "of")) else (
            "on " if right[0] == right[1] else "in ")
        out = head + prep + phrase + out[end:]
    return out, out != insight


# ------------------------------------------------------------------------------------------------ pronouns
#: third-person singular pronouns, by the person they refer to
_PRONOUNS = {"he": frozenset({"he", "him", "his", "himself"}), "she": frozenset({"she", "her", "hers", "herself"})}
_PRONOUN_WORD = re.compile(rf"\b({'|'.join(sorted(set().union(*_PRONOUNS.values())))})\b", re.IGNORECASE)
_SWAP = {"he": "she", "him": "her", "his": "her", "himself": "herself", "she": "he", "hers": "his",
         "herself": "himself"}
#: words after which "her" is an object ("helped her with …" → "him"), not a possessive ("her dogs" → "his")
_AFTER_OBJECT = frozenset("a an the to and or but with for in on at about that this these those up out off back so too "
                          "as from by into over again when while because if feel feels know knows".split())


def pronoun_of(text: str) -> str | None:
    """``"he"`` or ``"she"`` when ``text``'s third-person singular pronouns are all of that one set ("… his dogs" →
    "he"), None when it has none or both."""
    found = {key for key, words in _PRONOUNS.items() for w in _lower_words(text) if w.split("'")[0] in words}
    return found.pop() if len(found) == 1 else None


def pronoun_votes(texts: Iterable[str], lines: list[SourceLine]) -> dict[str, str]:
    """How the model's own sentences refer to each speaker of ``lines``: case-folded first name → ``"he"`` /
    ``"she"``, from every sentence of ``texts`` naming exactly one speaker and using one pronoun set ("Andrew got
    tattoos of his dogs." → andrew: he). A speaker referred to both ways, or never, is absent."""
    speakers, seen = set(_first_names(lines)), {}
    for text in texts:
        for sentence in split_sentences(text):
            named, said = people_named(sentence, speakers), pronoun_of(sentence)
            if len(named) == 1 and said:
                seen.setdefault(next(iter(named)), set()).add(said)
    return {name: next(iter(kinds)) for name, kinds in seen.items() if len(kinds) == 1}


def _swapped_pronoun(m: re.Match) -> str:
    word, rest = m.group(0), m.string[m.end():]
    low = word.casefold()
    if low == "her":
        after = _WORDS.findall(rest[:40].casefold())
        new = "him" if not after or not rest.startswith(" ") or after[0] in _AFTER_OBJECT else "his"
    else:
        new = _SWAP[low]
    return new.capitalize() if word[0].isupper() else new


def agree_pronouns(before: str, after: str, votes: dict[str, str], lines: list[SourceLine]) -> str:
    """``after`` (``before`` with one speaker's name replaced by another's, ``reattribute``) with its third-person
    singular pronouns switched to the new speaker's, when ``before``'s pronouns are the old speaker's and
    ``votes`` (``pronoun_votes``) knows both speakers' as different: "Audrey got tattoos of his dogs on his arm." →
    "… of her dogs on her arm." ("her" is "his" before a noun and "him" before a preposition, an article or the
    sentence's end). Unchanged when either speaker's pronouns are unknown, the text mixes pronoun sets, or the
    names were swapped both ways ("A told B" put right as "B told A"). ``lines``: the episode's messages."""
    speakers = set(_first_names(lines))
    old, new = people_named(before, speakers) - people_named(after, speakers), \
        people_named(after, speakers) - people_named(before, speakers)
    if len(old) != 1 or len(new) != 1:
        return after
    said, was, now = pronoun_of(after), votes.get(next(iter(old))), votes.get(next(iter(new)))
    if said is None or said != was or now is None or now == said:
        return after
    return _PRONOUN_WORD.sub(_swapped_pronoun, after)


def reattribute_sentences(text: str, lines: list[SourceLine]) -> tuple[str, int]:
    """``(text, moved)``: a narrative with each sentence that credits the wrong speaker (``misattributed_to``, judged
    sentence by sentence against the episode's messages ``lines``) put right, and how many sentences moved. A
    narrative that moves nothing comes back unchanged; one that does comes back with its spaces collapsed (as
    ``split_sentences`` reads it). "Caroline also mentioned that she had painted a sunset over a lake" from Melanie's
    "I painted that lake sunset" names Melanie; a sentence naming both speakers is never changed. Only the
    first-person rule runs here (``misattributed_to(..., second_person=False)``)."""
    flat = " ".join(text.split())
    moved = 0
    votes = pronoun_votes([flat], lines)
    previous = ""
    for sentence in split_sentences(flat):
        fixed, changed = reattribute(sentence, lines, second_person=False)
        if changed:
            fixed = agree_pronouns(sentence, fixed, votes, lines)
        else:
            fixed, changed = _pronoun_subject_put_right(sentence, previous, lines, votes)
        if changed and sentence in flat:
            flat = flat.replace(sentence, fixed, 1)
            moved += 1
        previous = fixed
    return (flat, moved) if moved else (text, 0)


_OPENING_PRONOUN = re.compile(r"^(He|She)\b")


def _pronoun_subject_put_right(sentence: str, previous: str, lines: list[SourceLine], votes: dict[str, str]
                               ) -> tuple[str, bool]:
    """``(sentence, changed)``: a narrative sentence opening with "He"/"She" and naming no speaker, read with the
    previous sentence's first-named speaker as its subject; when that reading credits the wrong speaker
    (``reattribute``), the pronoun becomes the right speaker's name: "Melanie asked what the group did for her. She
    said it made her feel accepted …" (Caroline's "it made me feel accepted …") → "Caroline said it made her feel
    accepted …"."""
    opening = _OPENING_PRONOUN.match(sentence)
    if opening is None:
        return sentence, False
    speakers = set(_first_names(lines))
    subject = first_name_written(previous, speakers)
    if subject is None or people_named(sentence, speakers):
        return sentence, False
    rest = sentence[opening.end():]
    if rest.startswith(("'s ", "’s ")):  # "He's considering …": "John is considering …", not "John's"
        rest = (" has " if rest[3:].startswith(("been ", "got ")) else " is ") + rest[3:]
    read = subject + rest
    fixed, changed = reattribute(read, lines, second_person=False)
    if not changed:
        return sentence, False
    fixed = agree_pronouns(read, fixed, votes, lines)
    said, meant = pronoun_of(fixed), first_name_written(fixed, speakers)
    if said is not None and (meant is None or votes.get(meant.casefold()) != said):
        return sentence, False  # "Nate mentioned that she likes …": the pronouns left would point elsewhere
    return fixed, True


# ------------------------------------------------------------------------------------------------ demo echoes
#: share of a text's content words a seed-demo sentence must hold for the text to echo the demo
#: (``echoes_demo``); the episode's own messages must then hold less than half of them.
DEMO_ECHO_OVERLAP = 0.8
#: a sentence holding this many words of one demo sentence that no message of its episode holds (verbs of speaking
#: and "named" aside) took them from the demo: "Caroline said she had adopted a rescue greyhound named Biscuit on 12
#: March 2022, which motivated her …" (conv-26, session 3) holds five of the seed demo's and half its words are the
#: episode's own, so the overlap test alone let it through.
DEMO_LEAK_WORDS = 3
_LEAK_IGNORED = frozenset({_stem(w) for w in SPEECH_VERBS} | {"nam", "name"})


def _texts(examples: Iterable[Any]) -> list[str]:
    """Every string (or list item) field value of ``examples`` (``dspy.Example`` or dicts)."""
    texts: list[str] = []
    for ex in examples:
        for value in (ex.toDict() if hasattr(ex, "toDict") else dict(ex)).values():
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list):
                texts += [str(v) for v in value]
    return texts


def demo_texts(module: Any) -> tuple[str, ...]:
    """The texts of every demo ``module``'s predictors show their model (``named_predictors()``: seed, bootstrapped
    or tuned demos alike), for ``echoes_demo``'s ``demos``; () for None."""
    if module is None:
        return ()
    return tuple(dict.fromkeys(_texts(d for _, p in module.named_predictors() for d in getattr(p, "demos", []))))


@functools.lru_cache(maxsize=64)
def _demo_sentences(extra: tuple[str, ...] = ()) -> tuple[frozenset[str], ...]:
    """Stemmed content words of every sentence of the seed demos (``signatures.demos.SEED_DEMOS``: their messages,
    narratives, facts, predictions and entries) and of the ``extra`` demo texts (``demo_texts``)."""
    from nemori_dspy.signatures.demos import SEED_DEMOS

    texts = _texts(ex for examples in SEED_DEMOS.values() for ex in examples) + list(extra)
    sentences = [x for t in texts for line in t.splitlines() for x in split_sentences(line)]
    return tuple(dict.fromkeys(frozenset(_stem(w) for w in content_words(x, set())) for x in sentences))


def echoes_demo(text: str, lines: list[SourceLine], demos: tuple[str, ...] = ()) -> bool:
    """Whether ``text`` restates a demo rather than its episode: a sentence of a seed demo, or of the ``demos`` the
    stage was shown (``demo_texts``: an optimizer's bootstrapped demos), holds ≥ ``DEMO_ECHO_OVERLAP`` of its content
    words (at least three of them; crudely stemmed, the episode's speakers aside) and the episode's messages
    ``lines`` together hold less than half of them; or ``DEMO_LEAK_WORDS`` words of one demo sentence that no
    message holds (a demo's dog, "Biscuit", "greyhound", "rescue", put into an episode about something else). The
    1.5B writer stored the demo's "Priya is starting a pottery class in April 2022." and "Tom's sister helped her dog
    with stairs …" (as Sam's) on conv-49; a fact that merely shares the demo's topic ("Melanie is starting a pottery
    class") is held by its own messages. With two demos the 1.5B teacher bootstrapped from conv-26, the 0.5B
    narrator wrote of Nate and Joanna (conv-42) "… while Melanie encourages her to continue her education and
    explore career options"."""
    speakers = set(_first_names(lines))
    words = {_stem(w) for w in content_words(text, speakers)}
    if len(words) < 3:
        return False
    said = {_stem(w) for _, content, _ in lines for w in content_words(content, speakers)}
    if any(len((words & d) - said - _LEAK_IGNORED) >= DEMO_LEAK_WORDS for d in _demo_sentences(demos)):
        return True
    if max((len(words & d) / len(words) for d in _demo_sentences(demos)), default=0.0) < DEMO_ECHO_OVERLAP:
        return False
    return len(words & said) / len(words) < DEMO_ECHO_OVERLAP / 2


def is_demo_echo(text: str, lines: list[SourceLine], demos: tuple[str, ...] = ()) -> bool:
    """Whether a non-empty narrative is nothing but a demo restated: every sentence ``echoes_demo`` (with ``demos``),
    so ``drop_demo_echoes`` would leave nothing. The 1.5B writer answered conv-30's first session (Jon lost his
    banking job) with "On 14 March 2022 Gina told Jon that she had adopted a rescue greyhound named Biscuit …",
    three times over; the pipeline re-asks such a reply and then quotes the messages instead of leaving the session
    unbuilt."""
    return bool(text.strip()) and not drop_demo_echoes(text, lines, demos)[0].strip()


def drop_demo_echoes(text: str, lines: list[SourceLine], demos: tuple[str, ...] = ()) -> tuple[str, int]:
    """``(text, dropped)``: a narrative without the sentences that echo a demo (``echoes_demo`` with ``demos``);
    unchanged when none does, else its sentences joined by single spaces."""
    sentences = split_sentences(text)
    kept = [x for x in sentences if not echoes_demo(x, lines, demos)]
    return (text, 0) if len(kept) == len(sentences) else (" ".join(kept), len(sentences) - len(kept))


# ------------------------------------------------------------------------------------------ narrative sentences
#: claim words a narrative sentence needs before ``drop_restatements`` judges it; shorter ones are left alone.
RESTATEMENT_MIN_WORDS = 3
_NEGATIONS = frozenset({"not", "no", "never", "nothing", "nobody", "none", "neither", "nor", "cannot"})
_QUOTED = re.compile(r"\u201c[^\u201d]*\u201d|\"[^\"]*\"")


def _claim_words(sentence: str, speakers: set[str]) -> frozenset[str]:
    """What a narrative sentence claims, as a set: its stemmed ``content_words`` without the speakers' names and
    the verbs of speaking (``SPEECH_VERBS``: "told", "mentioned", "shared"), plus every number and ``"¬"`` if it
    negates anything (so "did not paint" never restates "painted")."""
    words = _lower_words(sentence)
    claim = {_stem(w) for w in content_words(sentence, speakers) if w not in SPEECH_VERBS}
    claim |= set(re.findall(r"\d+", sentence))
    if any(w in _NEGATIONS or w.endswith("n't") for w in words):
        claim.add("\u00ac")
    return frozenset(claim)


def drop_restatements(text: str, lines: list[SourceLine]) -> tuple[str, int]:
    """``(text, dropped)``: a narrative without the sentences that say nothing an earlier sentence did not: every
    claim word (``_claim_words``: content words stemmed, speakers' names and verbs of speaking aside, numbers and
    negation kept) of the later sentence is in one earlier sentence, and it has at least ``RESTATEMENT_MIN_WORDS``.

    A looping 1.5B narrative of conv-26 session 2 ended "She also started to realize that self-care is important.
    … Melanie also told Caroline that she was starting to realize that self-care is important. Melanie also
    started to realize that self-care is important." (``junk.drop_repeated_sentences`` catches only word-for-word
    repeats); both later sentences go. A sentence adding anything ("… and it made her think of her family") stays.
    Unchanged when nothing is dropped, else the kept sentences joined by single spaces.

    Args:
        text: the narrative.
        lines: the episode's messages (``SourceLine``), for the speakers' names.
    """
    speakers = set(_first_names(lines))
    sentences = split_sentences(text)
    kept: list[str] = []
    seen: list[frozenset[str]] = []
    for sentence in sentences:
        claim = _claim_words(sentence, speakers)
        if len(claim) >= RESTATEMENT_MIN_WORDS and any(claim <= earlier for earlier in seen):
            continue
        kept.append(sentence)
        seen.append(claim)
    return (text, 0) if len(kept) == len(sentences) else (" ".join(kept), len(sentences) - len(kept))


def speaks_in_first_person(sentence: str) -> bool:
    """Whether a narrative sentence says "I", "my", "we"… outside its quotation marks: a chat line copied into a
    third-person account (quoted speech, ``Caroline said: “I'm thankful …”``, is not)."""
    return bool(FIRST_PERSON & set(_lower_words(_QUOTED.sub(" ", sentence))))


def _names_its_speaker(sentence: str, found: tuple[SourceLine, str] | None, lines: list[SourceLine]) -> bool:
    """Whether a narrative sentence saying "you" (``speaks_to_listener``) already tells who said it: its first named
    speaker is the one whose message it copies (``found``), or it copies none and names someone. Such a sentence is
    a third-person account with a "you" in it ("Joanna recommended "Little Women" as a great movie about … reaching
    for your dreams."), left as it is."""
    written = first_name_written(sentence, set(_first_names(lines)))
    if written is None:
        return False
    return found is None or _speaker_key(found[0][0]) == written.casefold()


def quote_first_person(text: str, lines: list[SourceLine]) -> tuple[str, int, int]:
    """``(text, quoted, dropped)``: a narrative whose sentences speaking in the first person
    (``speaks_in_first_person``) or to the listener (``speaks_to_listener``: "Great that you're prioritizing
    self-care.", conv-26 session 2) are put in a speaker's mouth or dropped.

    A first-person sentence copying a message (``difflib`` ratio ≥ ``CHAT_MATCH_RATIO`` against the message or a
    run of its sentences, ``_match``) becomes ``Caroline said: “<the passage>”``: the 1.5B writer ended conv-26's
    session-3 narrative with Caroline's "Conversations about gender identity and inclusion are so necessary and
    I'm thankful for being able to give a voice to the trans community.", which said neither who nor that it was
    said. One copying no message is dropped: in a third-person account nobody can tell whose "I" or "you" it is
    (a "you" sentence is matched with the names a small model put in front left out, ``_second_person_match``, and
    left as it is when it names the speaker whose message it copies, or copies none and names someone:
    ``_names_its_speaker``). A sentence
    is dropped only while another sentence is left, so a narrative is never emptied here. Unchanged when no
    sentence speaks in the first person, else its sentences joined by single spaces.

    Args:
        text: the narrative.
        lines: the episode's messages (``SourceLine``).
    """
    sentences = split_sentences(text)
    out: list[str | None] = []
    quoted = dropped = 0
    for sentence in sentences:
        first = speaks_in_first_person(sentence)
        if not first and not speaks_to_listener(sentence):
            out.append(sentence)
            continue
        found = _match(sentence, lines, None, CHAT_MATCH_RATIO) if first else _second_person_match(sentence, lines)
        if not first and _names_its_speaker(sentence, found, lines):
            out.append(sentence)
            continue
        if found is not None:
            (speaker, _, _), passage = found
            out.append(f"{speaker} said: \u201c{quote_text(passage)}\u201d")
            quoted += 1
        else:
            out.append(None)
            dropped += 1
    if dropped and not any(out):  # nothing else left: keep the unmatched sentences rather than empty the narrative
        out = [s if s is not None else orig for s, orig in zip(out, sentences)]
        dropped = 0
    if not quoted and not dropped:
        return text, 0, 0
    return " ".join(s for s in out if s is not None), quoted, dropped


# ------------------------------------------------------------------------------------------ P_ant's prediction
#: share of an insight's claim words one sentence of P_ant's prediction must hold for ``restates_prediction``
#: (0.75 in MEMORY_FORMAT 15; at 0.5 the 1.5B's paraphrases of the prediction, "John mentions making pizza as an
#: idea" from "John tells Maria about making pizza." on a run that never mentions pizza, are caught too).
PREDICTION_ECHO_OVERLAP = 0.5


_POSSESSIVE = re.compile(r"(?<=\w)['’]s\b")


def _root(word: str) -> str:
    """A ``_claim_words`` stem with a doubled last letter undone ("plann" of "planning" meets "plan" of "plans") and
    a final silent "e" dropped ("celebrate" meets "celebrat" of "celebrated")."""
    if len(word) > 3 and word.isalpha() and word[-1] == word[-2]:
        return word[:-1]
    return word[:-1] if len(word) > 4 and word.endswith("e") and word.isalpha() else word


def _roots(sentence: str, speakers: set[str]) -> frozenset[str]:
    """``_root``s of the ``_claim_words`` of ``sentence`` without its dates ("on June 9, 2023" is when, not what)
    and without possessive 's ("Melanie's" is a name)."""
    return frozenset(_root(w) for w in _claim_words(_POSSESSIVE.sub("", _without_dates(sentence)), speakers))


def restates_prediction(insight: str, predicted: str, lines: list[SourceLine]) -> bool:
    """Whether a P_dis insight restates P_ant's prediction rather than a message: one sentence of ``predicted``
    holds ≥ ``PREDICTION_ECHO_OVERLAP`` of its claim words (``_claim_words``: content words stemmed, names and verbs
    of speaking aside) while no message of ``lines`` holds ``ATTRIBUTION_OVERLAP`` of them, and it has at least
    ``RESTATEMENT_MIN_WORDS``.

    P_dis keeps what the prediction *missed* (§3.3.2); a sentence it took from the prediction and the messages do
    not hold is no prediction error but its input copied back. conv-26: the cue "Melanie tells Caroline about her
    plans to adopt a child" (Caroline's plan) became P_ant's "Melanie tells Caroline about her charity race and
    plans to adopt a child.", and P_dis returned "Melanie is planning to adopt a child." from a run of messages about
    the charity race and self-care. An insight a message states ("Caroline chose adoption services for LGBTQ+
    folks" beside "I chose them 'cause they help LGBTQ+ folks with adoption") is kept whatever the prediction says.

    Args:
        insight: one insight as P_dis wrote it.
        predicted: P_ant's prediction as P_dis saw it (``NOTHING_PREDICTED`` holds no claim of an episode).
        lines: the messages P_dis saw (``SourceLine``).
    """
    if not predicted.strip() or not lines:
        return False
    speakers = set(_first_names(lines))
    claim = _roots(insight, speakers)
    if len(claim) < RESTATEMENT_MIN_WORDS:
        return False
    if not any(len(claim & _roots(p, speakers)) >= PREDICTION_ECHO_OVERLAP * len(claim)
               for p in split_sentences(predicted)):
        return False
    return all(len(claim & _roots(content, speakers)) < ATTRIBUTION_OVERLAP * len(claim) for _, content, _ in lines)
