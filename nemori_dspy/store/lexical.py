"""Lexical retrieval beside the vector search: query terms for a trigram index and score fusion.

Why: the default embedder (all-MiniLM-L6-v2) is English-only, so for a Chinese query its cosine can
rank an unrelated episode first. Both stores therefore also match the query's words in
the stored text with a **trigram** index (SQLite FTS5 ``tokenize='trigram'``; Weaviate
``Tokenization.TRIGRAM``), which needs no word segmentation and so works for CJK as for English.

Fusion is a **weighted sum**: ``(1 - w) * cosine + w * lexical / max(lexical)`` with ``w`` =
``NemoriSettings.lexical_weight``, over the union of the top-C records by cosine and the top-C by
lexical score (C = ``max(CANDIDATES_PER_K * k, MIN_CANDIDATES)``); the cosine is each record's exact
one, the best lexical match counts 1, a record without a lexical match 0. The cosine is kept raw,
not min-max normalised: on a small memory (2–3 records) min-max would turn any cosine gap into
the full range and drown the lexical signal. ``w = 0`` is the paper's vector-only search (§3.4).

Weaviate computes its fusion on the server: ``hybrid`` with ``HybridFusion.RELATIVE_SCORE`` and
``alpha = 1 - w`` (min-max on both signals), the closest fusion it offers; the two backends rank
alike when a memory holds more than a handful of records, and may differ on tiny ones.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["LexicalQuery", "lexical_query", "weighted_fusion", "CANDIDATES_PER_K", "MIN_CANDIDATES", "STOPWORDS",
           "DEFAULT_LEXICAL_WEIGHT", "lexical_text"]

#: default w (``NemoriSettings.lexical_weight``); chosen on the synthetic fixtures (docs/configuration.md, Retrieval).
DEFAULT_LEXICAL_WEIGHT = 0.3

#: each signal's candidate list holds max(CANDIDATES_PER_K * k, MIN_CANDIDATES) records: wide enough
#: that a lexical match ranked low by the vector still competes, narrow enough that the min-max
#: normalisation is set by plausible hits, not by the whole collection.
CANDIDATES_PER_K = 4
MIN_CANDIDATES = 40

#: scripts written without spaces between words (Han, Hiragana, Katakana, Hangul).
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_WORD = re.compile(r"\w+", re.UNICODE)
_TRIGRAM = 3  # FTS5's trigram tokenizer matches only terms of at least 3 characters
#: a word in a spaced script must be this long: a 3-letter word is one trigram, which matches inside
#: unrelated words ("cat" in "education") and on the synthetic fixtures cost recall@1.
_MIN_WORD = 4
#: function words of English questions; as trigram phrases they match nearly every record.
STOPWORDS = frozenset("""about after again also because been before being between both could does doing down
during each from further have having here into itself just more most much once only other over same should
some such than that their them then there these they this those through under until very were what when where
which while whom whose will with would your yours""".split())


class LexicalQuery:
    """The terms of one query: ``long`` (≥ 3 characters, for the trigram index) and ``short``
    (1–2 character CJK runs, matched as substrings because a trigram index cannot hold them)."""

    def __init__(self, long: list[str], short: list[str]) -> None:
        self.long, self.short = long, short

    def __bool__(self) -> bool:
        return bool(self.long or self.short)

    def fts_match(self) -> str | None:
        """An FTS5 MATCH string: the long terms as quoted phrases joined by OR; None without long terms."""
        return " OR ".join(f'"{t}"' for t in self.long) or None


def _cjk_terms(run: str) -> tuple[list[str], list[str]]:
    """A CJK run has no spaces: its overlapping trigrams, or the run itself when shorter than 3."""
    if len(run) < _TRIGRAM:
        return [], [run]
    return [run[i:i + _TRIGRAM] for i in range(len(run) - _TRIGRAM + 1)], []


def lexical_query(text: str) -> LexicalQuery:
    """Terms of ``text``: words of ≥ 4 characters (lower-cased) that are not in ``STOPWORDS``, every
    trigram of each CJK run, and CJK runs of 1–2 characters as short terms. Shorter words ("of", "cat",
    "5") are dropped: a trigram index cannot match a 1–2 character term and matches a 3-letter one
    inside unrelated words. Duplicates are kept once, in order."""
    long: list[str] = []
    short: list[str] = []
    for word in _WORD.findall(text or ""):
        rest = _CJK.sub(" ", word)
        for run in _CJK.findall(word):
            lo, sh = _cjk_terms(run)
            long += lo
            short += sh
        long += [w.lower() for w in rest.split() if len(w) >= _MIN_WORD and w.lower() not in STOPWORDS]
    return LexicalQuery(list(dict.fromkeys(long)), list(dict.fromkeys(short)))


def lexical_text(*parts: str) -> str:
    """The text a record is matched on: its parts (cue, narrative, raw messages; or a fact) joined by newlines."""
    return "\n".join(p for p in parts if p)


def weighted_fusion(cosine: np.ndarray, lexical: tuple[np.ndarray, np.ndarray], weight: float) -> np.ndarray:
    """Fused scores ``(1 - w) * cosine + w * lexical / max(lexical)``.

    Args:
        cosine: (n,) cosine of every record to the query.
        lexical: (positions, scores) of the lexical candidates, scores > 0 (higher = better).
        weight: lexical weight w in [0, 1].
    Returns:
        float64 array of length n; records without a lexical match get ``(1 - w) * cosine``.
    """
    fused = (1.0 - weight) * np.asarray(cosine, dtype=np.float64)
    pos, vals = lexical
    vals = np.asarray(vals, dtype=np.float64)
    if len(pos) and weight > 0 and float(vals.max()) > 0:
        fused[pos] += weight * np.clip(vals, 0.0, None) / float(vals.max())
    return fused
