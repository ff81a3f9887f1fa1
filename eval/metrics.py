"""Answer-scoring metrics for LoCoMo: mem0/Nemori F1 and BLEU-1, LoCoMo's own F1, CIs, tables.

Definitions follow ``shared/data/locomo/README.md`` ("Scoring conventions"):

* mem0 / Nemori (``metrics/utils.py``, borrowed from A-Mem): set-based token F1 and
  NLTK BLEU-1 with smoothing method1.
* LoCoMo paper (snap-research/locomo ``task_eval/evaluation.py``): normalised, Porter-stemmed
  multiset F1 with per-category rules (1: comma sub-answers, 3: cut at ';', 5: phrase match).

All scores are floats in [0, 1].
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any

from nltk.stem import PorterStemmer
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from .locomo import CATEGORY_NAMES, SCORED_CATEGORIES

__all__ = [
    "token_f1",
    "bleu1",
    "f1_locomo",
    "f1_metric",
    "bleu1_metric",
    "f1_locomo_metric",
    "mean_ci95",
    "category_table",
]

_TOKENIZER = NLTKWordTokenizer()
_STEMMER = PorterStemmer()
_SMOOTH = SmoothingFunction().method1
_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_CAT5_PHRASES = ("no information available", "not mentioned")


# ---------------------------------------------------------------- mem0 / Nemori metrics

def _set_tokens(text: str) -> set[str]:
    for ch in ".,!?":
        text = text.replace(ch, " ")
    return set(str(text).lower().split())


def token_f1(prediction: str, gold: str) -> float:
    """Set-based token F1 as in mem0 / Nemori ``metrics/utils.py`` (from A-Mem).

    Both strings are lowercased, ``. , ! ?`` become spaces, and the whitespace-split
    tokens become **sets** (duplicates count once; no stemming, no article removal).
    F1 = 2PR/(P+R) with P = |common|/|pred|, R = |common|/|gold|. Returns 0.0 if either
    side has no tokens or nothing overlaps. Non-str inputs go through ``str()``.
    """
    pred, ref = _set_tokens(str(prediction)), _set_tokens(str(gold))
    common = len(pred & ref)
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str, gold: str) -> float:
    """BLEU-1 as in mem0 / Nemori: NLTK ``sentence_bleu`` with weights (1,0,0,0), smoothing method1.

    Tokens come from ``NLTKWordTokenizer().tokenize`` on the lowercased strings (the
    Treebank tokenizer inside ``word_tokenize``, without punkt sentence splitting, so no
    NLTK data download is needed). The value is the clipped unigram precision times the
    brevity penalty exp(1 - r/c) when c < r. Returns 0.0 if either side has no tokens.
    """
    pred = _TOKENIZER.tokenize(str(prediction).lower())
    ref = _TOKENIZER.tokenize(str(gold).lower())
    if not pred or not ref:
        return 0.0
    return float(sentence_bleu([ref], pred, weights=(1, 0, 0, 0), smoothing_function=_SMOOTH))


# ---------------------------------------------------------------- LoCoMo's own F1

def _normalise_locomo(text: str) -> str:
    text = str(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _locomo_f1_single(prediction: str, gold: str) -> float:
    pred = [_STEMMER.stem(w) for w in _normalise_locomo(prediction).split()]
    ref = [_STEMMER.stem(w) for w in _normalise_locomo(gold).split()]
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _locomo_multi_hop(prediction: str, gold: str) -> float:
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(_locomo_f1_single(p, g) for p in preds) for g in golds) / len(golds)


def f1_locomo(prediction: str, gold: str, category: int) -> float:
    """LoCoMo's own QA F1 (snap-research/locomo ``task_eval/evaluation.py``).

    Normalisation: remove commas, lowercase, strip ASCII punctuation, drop the words
    a/an/the/and, collapse whitespace; then Porter-stem each token and compute a
    multiset-overlap F1. Per category:

    * 1 (multi-hop): split both on ``,``; for each gold part take the best F1 over the
      predicted parts; average over gold parts.
    * 3 (open-domain): gold is cut at the first ``;`` before scoring.
    * 5 (adversarial): 1.0 if the prediction contains "no information available" or
      "not mentioned" (case-insensitive), else 0.0.
    * 2, 4: plain F1.

    Non-str inputs (e.g. int answers such as 2022) go through ``str()``.
    """
    prediction, gold, category = str(prediction), str(gold), int(category)
    if category == 5:
        low = prediction.lower()
        return 1.0 if any(p in low for p in _CAT5_PHRASES) else 0.0
    if category == 1:
        return _locomo_multi_hop(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return _locomo_f1_single(prediction, gold)


# ---------------------------------------------------------------- DSPy-form metrics

def _answer(obj: Any) -> str:
    value = getattr(obj, "answer", None)
    return "" if value is None else str(value).strip()


def f1_metric(example: Any, pred: Any, trace: Any = None) -> float:
    """DSPy metric: ``token_f1(pred.answer, example.answer)`` (mem0/Nemori set F1)."""
    return token_f1(_answer(pred), _answer(example))


def bleu1_metric(example: Any, pred: Any, trace: Any = None) -> float:
    """DSPy metric: ``bleu1(pred.answer, example.answer)`` (mem0/Nemori BLEU-1)."""
    return bleu1(_answer(pred), _answer(example))


def f1_locomo_metric(example: Any, pred: Any, trace: Any = None) -> float:
    """DSPy metric: ``f1_locomo(pred.answer, example.answer, example.category)`` (LoCoMo F1)."""
    return f1_locomo(_answer(pred), _answer(example), int(getattr(example, "category")))


# ---------------------------------------------------------------- aggregation

def mean_ci95(values: list[float]) -> tuple[float, float, float]:
    """Mean and normal-approximation 95% CI: (mean, low, high) = mean ∓ 1.96·sd/√n.

    ``sd`` is the sample standard deviation (n-1). Bounds are clipped to [0, 1] (scores
    are in [0, 1]). Empty input → (0.0, 0.0, 0.0); a single value v → (v, v, v).
    """
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(vals) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def _cell(rows: list[dict], metric: str) -> str:
    vals = [float(r[metric]) for r in rows if r.get(metric) is not None]
    if not vals:
        return "- (n=0)"
    return f"{100 * sum(vals) / len(vals):.1f} (n={len(vals)})"


def category_table(rows: list[dict], metrics: list[str], systems: list[str] | None = None) -> str:
    """Plain-text per-category score table.

    Args:
        rows: one dict per scored question with ``category`` (int), optional ``system``
            (str, default ``"nemori"``) and one float in [0, 1] per metric name.
        metrics: metric keys to show, one column each (header = metric name).
        systems: systems to show, in order; ``None`` → every system in order of appearance.

    Returns:
        A fixed-width table: for each system, one row per scored category (1-4, by name)
        and an ``overall`` row over categories 1-4; each cell is
        ``"<mean×100, 1 decimal> (n=<count>)"``.
    """
    if systems is None:
        systems = list(dict.fromkeys(r.get("system", "nemori") for r in rows))
    header = ["system", "category", *metrics]
    body: list[list[str]] = []
    for system in systems:
        mine = [r for r in rows if r.get("system", "nemori") == system
                and int(r["category"]) in SCORED_CATEGORIES]
        for cat in SCORED_CATEGORIES:
            sub = [r for r in mine if int(r["category"]) == cat]
            body.append([system, CATEGORY_NAMES[cat], *(_cell(sub, m) for m in metrics)])
        body.append([system, "overall", *(_cell(mine, m) for m in metrics)])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    fmt = lambda line: "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(l) for l in body)])
