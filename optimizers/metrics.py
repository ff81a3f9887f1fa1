"""Stage metrics for tuning: what each one measures and why it measures that stage's job.

All are DSPy metrics ``(example, pred, trace=None, pred_name=None, pred_trace=None)``. Called by
``dspy.Evaluate``, MIPROv2, SIMBA or BootstrapFewShot (no ``pred_name``) they return a float in [0, 1];
called by GEPA for feedback (``pred_name`` given) they return ``dspy.Prediction(score=float, feedback=str)``
whose text says what the output lost (which gold answers, which dates stayed relative, which insights
repeated memory), so the reflection model knows what to fix.

LLM-free on purpose: a construction stage's score must not depend on a second model's judgement, and a
trial must cost only the stage's own call.

* ``answer_metric`` (P_ans): set-based token F1 against the gold answer (mem0/Nemori convention,
  ``eval.metrics.token_f1``) — the paper's headline answer metric besides the LLM judge.
* ``JudgeF1Metric`` (P_ans tuned on correctness, the ``optimize --stage answer`` default): the mean of the
  LLM judge's verdict (CORRECT = 1) and token F1. F1 alone rewards brevity: a tuned answer stage that says
  "Yes" where the gold is "yes, teammates on his video game team" wins F1 and loses the judge. The judge is the
  one LLM in these metrics; ``optimize`` audits it on LoCoMo calibration pairs before it tunes anything.
* ``narrate_metric`` (P_nar): *answer coverage* of the narrative — the share of the episode's gold
  answers (questions whose evidence turns lie in the episode) recoverable from it — minus a length penalty
  (copying the messages verbatim must not win) and a penalty per relative date left unresolved. It measures
  what narration is for: later retrieval and answering read the narrative, not the messages (§3.2.2).
* ``distill_metric`` (P_ant + P_dis): the same coverage over the insights, minus a penalty per insight that
  restates an entry already in semantic memory (prediction error should keep only what memory missed,
  §3.3.2) and the same length penalty (listing every message as an insight must not win).
* ``consolidate_metric`` (P_con): accuracy of the action (new / merge / conflict) and, for merge and conflict,
  of the targets (Jaccard), on cases with a known right answer (§3.3.3).

Coverage of one gold answer: dates are compared as dates (``7 May 2023`` matches ``May 7, 2023`` and
``2023-05-07``; a gold ``May 2023`` matches any day of that month), the other words by Porter-stemmed token
recall without stop words; both halves weigh equally when a gold answer has both.
"""

from __future__ import annotations

import re
from typing import Any

import dspy
from nltk.stem import PorterStemmer

from nemori_dspy.eval.metrics import token_f1
from nemori_dspy.temporal import RELATIVE_DATE_PATTERN as _RELATIVE

__all__ = [
    "extract_dates", "content_tokens", "answer_coverage", "coverage_report", "length_penalty",
    "unresolved_relative_dates", "restatements", "answer_metric", "JudgeF1Metric", "ANSWER_METRICS", "ObservationMetric", "narrate_metric", "distill_metric",
    "consolidate_metric", "end_to_end_metric", "STAGE_METRICS", "LENGTH_FREE_RATIO", "LENGTH_WEIGHT", "RELATIVE_DATE_PENALTY",
    "RESTATEMENT_PENALTY", "RESTATEMENT_JACCARD",
]

#: outputs up to this share of the messages' word count cost nothing; above it, the excess is subtracted
#: (× ``LENGTH_WEIGHT``). A verbatim copy (ratio ≈ 1) thus loses 0.5: it never beats a faithful summary.
LENGTH_FREE_RATIO = 0.5
LENGTH_WEIGHT = 1.0
#: subtracted per relative date ("last week") left without an absolute date near it (at most 3 counted).
RELATIVE_DATE_PENALTY = 0.1
#: subtracted per insight restating a known entry (at most 5 counted).
RESTATEMENT_PENALTY = 0.1
#: an insight restates a known entry at this Jaccard similarity of their content-token sets (or more).
RESTATEMENT_JACCARD = 0.7

_MONTHS = {m: i for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july", "august",
                                       "september", "october", "november", "december"], 1)}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MON = r"(january|february|march|april|may|june|july|august|september|october|november|december|" \
       r"jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_ORD = r"(?:st|nd|rd|th)?"
_DATE_PATTERNS = [
    (re.compile(rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?{_MON},?\s+(\d{{4}})\b", re.I), ("d", "m", "y")),
    (re.compile(rf"\b{_MON}\s+(\d{{1,2}}){_ORD},?\s+(\d{{4}})\b", re.I), ("m", "d", "y")),
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), ("y", "m", "d")),
    (re.compile(rf"\b{_MON},?\s+(\d{{4}})\b", re.I), ("m", "y")),
    (re.compile(r"\b(19\d{2}|20\d{2})\b"), ("y",)),
]
_STOP = set("""a an the and or of to in on at for with by from as is are was were be been being it its this that these
those he she they them his her their i me my we our you your who whom what which when where why how did do does done
has have had not no yes but so if than then there here about into over after before during also just very""".split())
_STEM = PorterStemmer()
_WORD = re.compile(r"[a-z0-9']+")

Date = tuple[int | None, int | None, int | None]  # (year, month, day); None = not stated


def extract_dates(text: str) -> tuple[list[Date], str]:
    """Dates written in ``text`` as (year, month, day) with None for parts not stated, and the text
    with those date spans blanked out (so their words do not count again as content tokens).

    Recognised: ``7 May 2023``, ``7th of May, 2023``, ``May 7, 2023``, ``2023-05-07``, ``May 2023``,
    a bare year ``2023``. A more specific match wins over a less specific one on the same span.
    """
    dates: list[Date] = []
    rest = text
    for pattern, order in _DATE_PATTERNS:
        def take(m: re.Match) -> str:
            parts = dict(zip(order, m.groups()))
            month = parts.get("m")
            mon = _MONTHS.get(month.lower().rstrip(".")) if month and not month.isdigit() else (
                int(month) if month else None)
            day = int(parts["d"]) if parts.get("d") else None
            if mon is not None and not 1 <= mon <= 12 or day is not None and not 1 <= day <= 31:
                return m.group(0)
            dates.append((int(parts["y"]), mon, day))
            return " " * len(m.group(0))
        rest = pattern.sub(take, rest)
    return dates, rest


def content_tokens(text: str) -> set[str]:
    """Porter-stemmed lowercase word tokens of ``text`` without stop words."""
    return {_STEM.stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP}


def _date_found(gold: Date, found: list[Date]) -> bool:
    return any(all(g is None or g == f for g, f in zip(gold, cand)) for cand in found)


def answer_coverage(text: str, gold: str) -> float | None:
    """How much of one gold answer ``text`` holds, in [0, 1]; None for an empty gold answer.

    Date part: share of the gold's dates found in ``text`` (parts the gold states must agree). Word part:
    share of the gold's content tokens (``content_tokens``, outside dates) found in ``text``. The mean of the
    parts the gold answer has.
    """
    gold_dates, gold_rest = extract_dates(str(gold))
    gold_words = content_tokens(gold_rest)
    if not gold_dates and not gold_words:
        return None
    text_dates, _ = extract_dates(text)
    text_words = content_tokens(text)
    parts = []
    if gold_dates:
        parts.append(sum(_date_found(d, text_dates) for d in gold_dates) / len(gold_dates))
    if gold_words:
        parts.append(len(gold_words & text_words) / len(gold_words))
    return sum(parts) / len(parts)


def coverage_report(text: str, golds: list[str]) -> tuple[float | None, list[str], list[str]]:
    """(mean coverage over the non-empty gold answers or None, gold answers lost (< 0.5), gold answers kept)."""
    scored = [(g, answer_coverage(text, g)) for g in golds]
    scored = [(g, c) for g, c in scored if c is not None]
    if not scored:
        return None, [], []
    mean = sum(c for _, c in scored) / len(scored)
    return mean, [g for g, c in scored if c < 0.5], [g for g, c in scored if c >= 0.5]


def _words(text: str) -> int:
    return len(_WORD.findall(text.lower()))


def _message_words(messages: str) -> int:
    """Words of the messages' contents (the ``[date] speaker:`` prefix of each line left out)."""
    return sum(_words(line.split(": ", 1)[-1]) for line in messages.splitlines())


def length_penalty(output: str, messages: str) -> tuple[float, float]:
    """(penalty, ratio): ratio = output words / message words; penalty = max(0, ratio − 0.5) × 1.0."""
    ratio = _words(output) / max(1, _message_words(messages))
    return max(0.0, ratio - LENGTH_FREE_RATIO) * LENGTH_WEIGHT, ratio


def unresolved_relative_dates(text: str, window: int = 40) -> list[str]:
    """Relative expressions ("last week", "yesterday") in ``text`` with no explicit date within ``window``
    characters on either side."""
    out = []
    for m in _RELATIVE.finditer(text):
        around = text[max(0, m.start() - window):m.end() + window]
        if not extract_dates(around)[0]:
            out.append(m.group(0))
    return out


def restatements(insights: list[str], known: list[str]) -> list[str]:
    """Insights whose content tokens overlap a known entry's at Jaccard ≥ 0.7 (or equal after lowercasing)."""
    known_sets = [(k.strip().lower(), content_tokens(k)) for k in known]
    out = []
    for ins in insights:
        toks = content_tokens(ins)
        for text, ks in known_sets:
            union = toks | ks
            if ins.strip().lower() == text or (union and len(toks & ks) / len(union) >= RESTATEMENT_JACCARD):
                out.append(ins)
                break
    return out


def _result(score: float, feedback: str, pred_name: str | None) -> Any:
    score = min(1.0, max(0.0, score))
    return dspy.Prediction(score=score, feedback=feedback) if pred_name is not None else score


def _golds(example: Any) -> list[str]:
    return [str(g) for g in (getattr(example, "gold_answers", None) or [])]


def _lost_text(lost: list[str], example: Any) -> str:
    qs = dict(zip(_golds(example), getattr(example, "questions", None) or []))
    return "; ".join(f"'{g}' (asked: {qs[g]})" if g in qs else f"'{g}'" for g in lost[:6])


# ---------------------------------------------------------------- per stage

def answer_metric(example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                  pred_trace: Any = None) -> Any:
    """P_ans: token F1 of ``pred.answer`` against ``example.answer`` (mem0/Nemori set-based F1), in [0, 1]."""
    answer, gold = str(getattr(pred, "answer", "") or ""), str(getattr(example, "answer", "") or "")
    score = token_f1(answer, gold)
    if score >= 1.0:
        feedback = "Correct: the answer matches the gold answer."
    else:
        feedback = (f"Token F1 {score:.2f}. The gold answer is '{gold}'; the answer given was '{answer}'. "
                    "Answer with the short phrase from the context that answers the question (names, dates "
                    "as written in the context), without extra words.")
    return _result(score, feedback, pred_name)


#: ``optimize --answer-metric`` choices → the judge's weight in the answer score (f1 = token F1 alone).
ANSWER_METRICS = {"judge+f1": 0.5, "judge": 1.0, "f1": 0.0}


class JudgeF1Metric:
    """P_ans metric on correctness: ``judge_weight × judge + (1 − judge_weight) × token F1``, in [0, 1].

    ``judge`` is a callable ``(example, pred) -> 1.0 | 0.0`` (``eval.judge.LLMJudge``); its verdict per
    (question, gold, answer) is cached, so ``parts`` (the two scores side by side, for reports) costs no second
    judge call. Called with ``pred_name`` (GEPA) it returns ``dspy.Prediction(score, feedback)`` naming the
    verdict, the gold answer and what was said; else a float (MIPROv2, BootstrapFewShot, ``dspy.Evaluate``).

    Args:
        judge: the LLM judge (the run's judge model; ``optimize`` uses the reflection model).
        judge_weight: in [0, 1]; 0.5 = judge and F1 together (``ANSWER_METRICS``).
    Raises:
        ValueError: ``judge_weight`` outside [0, 1].
    """

    def __init__(self, judge: Any, judge_weight: float = 0.5) -> None:
        if not 0.0 <= judge_weight <= 1.0:
            raise ValueError(f"judge_weight={judge_weight}: must be in [0, 1]. Fix: 0.5 weighs judge and F1 equally.")
        self.judge, self.judge_weight = judge, judge_weight
        self._verdicts: dict[tuple[str, str, str], float] = {}

    def verdict(self, example: Any, pred: Any) -> float:
        """The judge's 1.0 (CORRECT) or 0.0 for this answer (one judge call per distinct answer)."""
        key = (str(example.question), str(example.answer), str(getattr(pred, "answer", "") or ""))
        if key not in self._verdicts:
            self._verdicts[key] = float(self.judge(example, dspy.Prediction(answer=key[2])))
        return self._verdicts[key]

    def parts(self, example: Any, pred: Any) -> dict[str, float]:
        """``{"judge": 1.0 | 0.0, "f1": token F1}`` of one answer (reports print both beside the score)."""
        f1 = token_f1(str(getattr(pred, "answer", "") or ""), str(getattr(example, "answer", "") or ""))
        return {"judge": self.verdict(example, pred) if self.judge_weight > 0 else 0.0, "f1": f1}

    def __call__(self, example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                 pred_trace: Any = None) -> Any:
        p = self.parts(example, pred)
        score = self.judge_weight * p["judge"] + (1 - self.judge_weight) * p["f1"]
        answer, gold = str(getattr(pred, "answer", "") or ""), str(getattr(example, "answer", "") or "")
        if score >= 1.0:
            feedback = "Correct: the judge accepts the answer and it matches the gold answer's words."
        elif p["judge"] >= 1.0:
            feedback = (f"The judge accepts '{answer}' for gold '{gold}', token F1 {p['f1']:.2f}: keep the facts, "
                        "use the context's own words.")
        else:
            feedback = (f"Wrong (LLM judge): the gold answer is '{gold}'; the answer given was '{answer}' "
                        f"(token F1 {p['f1']:.2f}). Find the fact in the context that answers the question and "
                        "state it in full (who, what, when); a bare 'Yes', 'None' or a date alone is wrong when "
                        "the gold names more.")
        return _result(score, feedback, pred_name)


def narrate_metric(example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                   pred_trace: Any = None) -> Any:
    """P_nar: answer coverage of ``cue + narrative`` − length penalty − 0.1 per unresolved relative date.

    ``example`` has inputs ``messages`` and labels ``gold_answers`` (and ``questions`` for feedback). An
    example without gold answers scores only the penalties (1 − penalties).
    """
    text = f"{getattr(pred, 'cue', '') or ''}\n{getattr(pred, 'narrative', '') or ''}"
    cov, lost, _ = coverage_report(text, _golds(example))
    pen, ratio = length_penalty(str(getattr(pred, "narrative", "") or ""), example.messages)
    rel = unresolved_relative_dates(text)
    score = (1.0 if cov is None else cov) - pen - RELATIVE_DATE_PENALTY * min(3, len(rel))
    notes = [f"Answer coverage {cov:.2f}." if cov is not None else "No gold answers for this episode."]
    if lost:
        notes.append(f"The narrative lost these facts that later questions ask about: {_lost_text(lost, example)}. "
                     "Keep such concrete details (names, places, dates, objects, numbers).")
    if pen:
        notes.append(f"The narrative is {ratio:.0%} as long as the messages (penalty {pen:.2f}): summarise, "
                     "do not copy the messages.")
    if rel:
        notes.append(f"Relative dates left unresolved: {', '.join(repr(r) for r in rel[:3])}; write the absolute "
                     "date from the message timestamps.")
    return _result(score, " ".join(notes), pred_name)


def distill_metric(example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                   pred_trace: Any = None) -> Any:
    """P_ant + P_dis: answer coverage of the insights − 0.1 per insight restating a known entry − length penalty.

    ``example`` has input ``episode_messages`` and labels ``gold_answers`` and ``known_before`` (the texts of
    the semantic entries nearest the episode before it was distilled).
    """
    insights = [str(i) for i in (getattr(pred, "insights", None) or [])]
    text = "\n".join(insights)
    cov, lost, _ = coverage_report(text, _golds(example))
    again = restatements(insights, list(getattr(example, "known_before", None) or []))
    pen, ratio = length_penalty(text, example.episode_messages)
    score = (1.0 if cov is None else cov) - RESTATEMENT_PENALTY * min(5, len(again)) - pen
    notes = [f"Answer coverage {cov:.2f} over {len(insights)} insight(s)." if cov is not None
             else "No gold answers for this episode."]
    if lost:
        notes.append(f"These facts from the episode were not extracted: {_lost_text(lost, example)}.")
    if again:
        notes.append(f"{len(again)} insight(s) restate what memory already knew, e.g. '{again[0]}': keep only "
                     "what the prediction missed.")
    if pen:
        notes.append(f"The insights are {ratio:.0%} as long as the messages (penalty {pen:.2f}): one short "
                     "fact per insight, no copying.")
    return _result(score, " ".join(notes), pred_name)


class ObservationMetric:
    """P_nar or P_ant + P_dis scored against LoCoMo's gold ``observation`` annotations of the episode's turns
    (the memory issue's measure of what memory holds), in [0, 1]; examples without observations fall back to
    ``narrate_metric`` / ``distill_metric`` (answer coverage).

    * ``narrate``: 0.5 × coverage (share of the episode's gold observations that a narrative sentence, or two
      consecutive ones, states) + 0.5 × faithfulness (share of narrative sentences a message or two consecutive
      messages state) − length penalty over *every* output field (cue + narrative, ``length_penalty``). A
      narrative or cue that echoes an instruction or field description (``junk.junk_reason``) or is a copied chat
      line (``insight_rules.is_chat_line``) scores 0: the pipeline would not store it.
    * ``distill``: 0.5 × recall of the gold observations memory did *not* already hold (none of ``known_before``
      states them: prediction error, §3.3.2) + 0.5 × support (share of insights a message window states) −
      0.1 per insight restating a known entry − length penalty. An episode whose observations memory already
      held rewards saying nothing new (recall 1 with no insight, 0.5 with some).

    "States" is ``eval.memory_quality.FactMatcher`` (the memory's own embedder) for the gold observations and
    ``eval.memory_quality.SupportChecker`` for support by the messages, as in the Memory table.
    GEPA feedback names the observations missed, the sentences or insights no message supports, echoes,
    copies and restatements.

    Args:
        matcher: a ``FactMatcher``.
        stage: "narrate" or "distill" (``anticipate`` and ``anticipate+distill`` use "distill").
        support: a ``SupportChecker`` (default: one on ``matcher``'s embedder, built at the first call).
    Raises:
        ValueError: another stage.
    """

    def __init__(self, matcher: Any, stage: str, support: Any = None) -> None:
        if stage not in ("narrate", "distill"):
            raise ValueError(f"ObservationMetric stage {stage!r}: must be 'narrate' or 'distill'.")
        self.matcher, self.stage = matcher, stage
        self._support: Any = support
        self._measured: dict[tuple, tuple[float, list[str], dict[str, float]]] = {}

    def __call__(self, example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                 pred_trace: Any = None) -> Any:
        measured = self._measure(example, pred)
        if measured is None:
            fallback = narrate_metric if self.stage == "narrate" else distill_metric
            return fallback(example, pred, trace, pred_name, pred_trace)
        score, notes, _ = measured
        return _result(score, " ".join(notes), pred_name)

    def parts(self, example: Any, pred: Any) -> dict[str, float]:
        """The score's parts for one output, in [0, 1], so reports pair them before/after (``optimize`` prints
        ``paired recall`` beside the score): ``{"coverage", "faithfulness"}`` for narrate, ``{"recall",
        "support"}`` for distill (recall of the observations new to memory, support of the insights); ``{}`` for
        an example without gold observations (scored by the fallback metric). An unusable narrative (echo, copy,
        empty) has both narrate parts 0, as its score."""
        measured = self._measure(example, pred)
        return {} if measured is None else measured[2]

    def _measure(self, example: Any, pred: Any) -> tuple[float, list[str], dict[str, float]] | None:
        """``(score, notes, parts)`` of one output against the example's gold observations, None without any;
        memoised on what it reads, so ``parts`` after a scoring call (``score_program``) embeds nothing again."""
        golds = [str(g) for g in (getattr(example, "observations", None) or [])]
        if not golds:
            return None
        if self.stage == "narrate":
            key: tuple = (tuple(golds), str(example.messages), str(getattr(pred, "cue", "") or ""),
                          str(getattr(pred, "narrative", "") or ""))
        else:
            key = (tuple(golds), tuple(str(k) for k in (getattr(example, "known_before", None) or [])),
                   str(example.episode_messages), tuple(str(i) for i in (getattr(pred, "insights", None) or [])))
        if key not in self._measured:
            self._measured[key] = (self._narrate if self.stage == "narrate" else self._distill)(example, pred, golds)
        return self._measured[key]

    def _lines(self, messages: str) -> tuple[list[tuple[str, str, str]], set[str]]:
        """The rendered ``messages`` as the support checker's lines ``(speaker, "", content)``, and the speakers."""
        from nemori_dspy.insight_rules import message_lines

        pairs = message_lines(messages)
        return [(who, "", text) for who, text in pairs], {who for who, _ in pairs}

    def _supported(self, texts: list[str], messages: str) -> list[bool]:
        """Which ``texts`` the rendered ``messages`` state (``eval.memory_quality.SupportChecker``, as the Memory
        table's fact support and narrative faithfulness)."""
        from nemori_dspy.eval.memory_quality import SupportChecker

        if self._support is None:
            self._support = SupportChecker(self.matcher.embedder)
        return self._support.supported(texts, self._lines(messages)[0])

    def _stated(self, texts: list[str], candidates: list[str]) -> list[bool]:
        if not texts or not candidates:
            return [False] * len(texts)
        return [bool(x) for x in self.matcher.match_matrix(texts, candidates).any(axis=1)]

    def _narrate(self, example: Any, pred: Any, golds: list[str]) -> tuple[float, list[str], dict[str, float]]:
        from nemori_dspy.eval.memory_quality import resolve_pronouns, sentences, with_adjacent_pairs
        from nemori_dspy.insight_rules import is_chat_line
        from nemori_dspy.junk import junk_reason

        cue, narrative = str(getattr(pred, "cue", "") or ""), str(getattr(pred, "narrative", "") or "")
        speakers = self._lines(example.messages)[1]
        echo = next((r for r in (junk_reason(narrative), junk_reason(cue) if cue.strip() else None) if r), None)
        if echo or not narrative.strip() or is_chat_line(narrative, speakers):
            why = (f"it echoes {echo}" if echo else "it is empty" if not narrative.strip() else
                   "it copies a chat line")
            return 0.0, [f"Score 0: the narrative is unusable ({why}). Write a third-person account of what the "
                         "speakers said and did, with dates."], {"coverage": 0.0, "faithfulness": 0.0}
        sents = sentences(narrative)
        covered = self._stated(golds, with_adjacent_pairs(sents))
        people = {who.split()[0].casefold() for who in speakers if who.strip()}
        supported = self._supported(resolve_pronouns(sents, people), example.messages)
        coverage, faithful = sum(covered) / len(golds), (sum(supported) / len(sents) if sents else 0.0)
        pen, ratio = length_penalty(f"{cue} {narrative}", example.messages)
        notes = [f"Covers {sum(covered)} of {len(golds)} gold observations; {sum(supported)} of {len(sents)} "
                 "sentences are stated by the messages."]
        missed = [g for g, c in zip(golds, covered) if not c]
        if missed:
            notes.append("Missed: " + "; ".join(f"'{g}'" for g in missed[:5]) + ".")
        unsupported = [t for t, ok in zip(sents, supported) if not ok]
        if unsupported:
            notes.append("Not in the messages (invented or unclear): " + "; ".join(f"'{t}'" for t in unsupported[:3]))
        if pen:
            notes.append(f"Cue + narrative are {ratio:.0%} as long as the messages (penalty {pen:.2f}).")
        return 0.5 * coverage + 0.5 * faithful - pen, notes, {"coverage": coverage, "faithfulness": faithful}

    def _distill(self, example: Any, pred: Any, golds: list[str]) -> tuple[float, list[str], dict[str, float]]:
        insights = [str(i) for i in (getattr(pred, "insights", None) or []) if str(i).strip()]
        known = [str(k) for k in (getattr(example, "known_before", None) or [])]
        held = self._stated(golds, known)
        new = [g for g, h in zip(golds, held) if not h]
        found = self._stated(new, insights)
        recall = sum(found) / len(new) if new else (1.0 if not insights else 0.5)
        supported = self._supported(insights, example.episode_messages)
        support = sum(supported) / len(insights) if insights else 1.0
        again = [i for i, r in zip(insights, self._stated(insights, known)) if r] if known else []
        pen, ratio = length_penalty("\n".join(insights), example.episode_messages)
        notes = [f"{len(new)} of {len(golds)} gold observations were new to memory; the insights state "
                 f"{sum(found)} of them; {sum(supported)} of {len(insights)} insights are stated by the messages."]
        missed = [g for g, f in zip(new, found) if not f]
        if missed:
            notes.append("Missed (memory did not know them): " + "; ".join(f"'{g}'" for g in missed[:5]) + ".")
        unsupported = [t for t, ok in zip(insights, supported) if not ok]
        if unsupported:
            notes.append("Not in the messages: " + "; ".join(f"'{t}'" for t in unsupported[:3]) + ".")
        if again:
            notes.append(f"{len(again)} insight(s) restate what memory already knew, e.g. '{again[0]}'.")
        if pen:
            notes.append(f"The insights are {ratio:.0%} as long as the messages (penalty {pen:.2f}).")
        score = 0.5 * recall + 0.5 * support - RESTATEMENT_PENALTY * min(5, len(again)) - pen
        return score, notes, {"recall": recall, "support": support}


def consolidate_metric(example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                       pred_trace: Any = None) -> Any:
    """P_con: 0 for a wrong action; for the right one 1 (``new``) or 0.5 + 0.5 × Jaccard(targets) (merge/conflict).

    ``example`` labels: ``action`` ("new" | "merge" | "conflict") and ``targets`` (1-based entry numbers).
    """
    gold_action, action = str(example.action), str(getattr(pred, "action", "") or "").strip().lower()
    gold_t = {int(t) for t in (example.targets or [])}
    try:
        got_t = {int(t) for t in (getattr(pred, "targets", None) or [])}
    except (TypeError, ValueError):
        got_t = set()
    if action != gold_action:
        score = 0.0
        feedback = f"Wrong action: '{action}', the right one is '{gold_action}'" + (
            f" with targets {sorted(gold_t)}." if gold_t else ".")
    elif gold_action == "new":
        score, feedback = 1.0, "Correct: new."
    else:
        union = gold_t | got_t
        score = 0.5 + 0.5 * (len(gold_t & got_t) / len(union) if union else 1.0)
        feedback = (f"Right action '{action}'; targets {sorted(got_t)} vs the right {sorted(gold_t)}."
                    + ("" if got_t == gold_t else " Name exactly the entries about the same subject."))
    return _result(score, feedback, pred_name)


def end_to_end_metric(example: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                      pred_trace: Any = None) -> Any:
    """End to end: mean token F1 of ``pred.answers`` against ``example.gold_answers`` (one conversation's
    questions, in order), after rebuilding its memory with the candidate construction stages."""
    golds = [str(g) for g in example.gold_answers]
    answers = list(getattr(pred, "answers", None) or [])
    scores = [token_f1(str(a), g) for a, g in zip(answers, golds)] + [0.0] * max(0, len(golds) - len(answers))
    score = sum(scores) / len(scores) if scores else 0.0
    worst = sorted(zip(scores, golds, answers), key=lambda t: t[0])[:3]
    feedback = f"Mean answer F1 {score:.2f} over {len(golds)} questions after rebuilding memory. " + "; ".join(
        f"gold '{g}', answered '{a}'" for s, g, a in worst if s < 1.0)
    return _result(score, feedback, pred_name)


#: stage → its metric (``distill`` and ``anticipate`` share ``distill_metric``).
STAGE_METRICS = {"answer": answer_metric, "narrate": narrate_metric, "distill": distill_metric,
                 "anticipate": distill_metric, "consolidate": consolidate_metric}
