"""Answer-scoring metrics for LoCoMo: mem0/Nemori F1 and BLEU-1, LoCoMo's own F1, CIs, tables.

Definitions follow ``shared/data/locomo/README.md`` ("Scoring conventions"):

* mem0 / Nemori (``metrics/utils.py``, borrowed from A-Mem): set-based token F1 and
  NLTK BLEU-1 with smoothing method1.
* LoCoMo paper (snap-research/locomo ``task_eval/evaluation.py``): normalised, Porter-stemmed
  multiset F1 with per-category rules (1: comma sub-answers, 3: cut at ';', 5: phrase match).
* Retrieval: :func:`evidence_recall_at_k`, LLM-free share of gold evidence turns retrieved.

All scores are floats in [0, 1]. Tables (:func:`category_table` with 95% CIs,
:func:`cost_table`, the per-stage "Table 9" layout, :func:`answer_time_table`, the per-system
"Table 4" layout) are plain text. Paired statistics (:func:`paired_bootstrap`, :func:`mcnemar_exact`,
:func:`paired_table`) compare two systems on the questions both answered.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any, Callable

from nltk.stem import PorterStemmer
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from nemori_dspy.eval.locomo import CATEGORY_NAMES, SCORED_CATEGORIES, normalise_evidence

__all__ = [
    "token_f1",
    "bleu1",
    "f1_locomo",
    "f1_metric",
    "bleu1_metric",
    "f1_locomo_metric",
    "mean_ci95",
    "format_cell",
    "format_table",
    "category_scores",
    "category_table",
    "Group",
    "LOCOMO_GROUPS",
    "scored_groups",
    "evidence_recall_at_k",
    "norm_id",
    "usage_dict",
    "ordered_stages",
    "token_shares",
    "cost_table",
    "answer_time_table",
    "PAIRED_METRICS",
    "paired_bootstrap",
    "mcnemar_exact",
    "paired_compare",
    "paired_scores",
    "paired_stats",
    "paired_table",
    "paired_table_from_stats",
    "paired_line",
    "format_p",
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


def format_cell(values: list[float]) -> str:
    """One table cell: ``"<mean×100> [<low×100>–<high×100>] (n=<count>)"``, 1 decimal.

    The interval is :func:`mean_ci95` (normal approximation, clipped to [0, 1]); ``None``
    values must already be removed. No values → ``"- (n=0)"``.
    Example: ``[0.4, 0.6, 0.5, 0.5]`` → ``"50.0 [42.0–58.0] (n=4)"``.
    """
    if not values:
        return "- (n=0)"
    mean, low, high = mean_ci95(values)
    return f"{100 * mean:.1f} [{100 * low:.1f}–{100 * high:.1f}] (n={len(values)})"


def _values(rows: list[dict], metric: str) -> list[float]:
    """The non-``None`` values of ``metric`` in ``rows`` (rows lacking the key are skipped)."""
    return [float(r[metric]) for r in rows if r.get(metric) is not None]


def _system(row: dict) -> str:
    return str(row.get("system", "nemori"))


Group = tuple[str, Callable[[dict], bool]]
"""A table row group: (name, which rows belong to it). Groups may overlap (e.g. LongMemEval's abstention)."""

LOCOMO_GROUPS: list[Group] = [(CATEGORY_NAMES[c], lambda r, c=c: int(r["category"]) == c) for c in SCORED_CATEGORIES]
"""LoCoMo categories 1-4 by name (category 5 belongs to no group, so it is never scored)."""


def scored_groups(rows: list[dict], system: str, groups: list[Group] | None = None) -> list[tuple[str, list[dict]]]:
    """``[(group name, rows)]`` for each group then ``("overall", rows in any group)`` for one system.

    ``groups`` defaults to :data:`LOCOMO_GROUPS` (categories 1-4; overall pools them).
    """
    groups = groups if groups is not None else LOCOMO_GROUPS
    mine = [r for r in rows if _system(r) == system and any(member(r) for _, member in groups)]
    return [*((name, [r for r in mine if member(r)]) for name, member in groups), ("overall", mine)]


def category_scores(rows: list[dict], metric: str, systems: list[str] | None = None,
                    groups: list[Group] | None = None) -> dict[str, dict[str, tuple[float, float, float, int]]]:
    """``{system: {category name | "overall": (mean, low, high, n)}}`` for one metric.

    Same selection as :func:`category_table` (categories 1-4, ``None`` values skipped);
    mean/low/high are in [0, 1] from :func:`mean_ci95`, ``n`` counts the rows with a value.
    """
    systems = systems if systems is not None else _systems(rows)
    out: dict[str, dict[str, tuple[float, float, float, int]]] = {}
    for system in systems:
        for name, sub in scored_groups(rows, system, groups):
            vals = _values(sub, metric)
            out.setdefault(system, {})[name] = (*mean_ci95(vals), len(vals))
    return out


def _systems(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(_system(r) for r in rows))


def format_table(header: list[str], body: list[list[str]], key_cols: int = 1, width: int = 120) -> str:
    """Left-aligned fixed-width text table, columns two spaces apart.

    If a line would be wider than ``width`` characters, the columns after the first
    ``key_cols`` are split into the fewest equal-sized blocks that fit; each block repeats
    the key columns and is separated from the next by a blank line.
    """
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    out: list[str] = []
    for cols in _column_blocks(widths, key_cols, width):
        idx = [*range(key_cols), *cols]
        fmt = lambda line: "  ".join(line[i].ljust(widths[i]) for i in idx).rstrip()  # noqa: E731
        out += ([""] if out else []) + [fmt(header), fmt(["-" * w for w in widths]), *(fmt(l) for l in body)]
    return "\n".join(out)


def _column_blocks(widths: list[int], key_cols: int, width: int) -> list[list[int]]:
    """Value-column indices split into the fewest equal chunks whose lines fit ``width``."""
    cols = list(range(key_cols, len(widths)))
    key = sum(widths[:key_cols]) + 2 * key_cols
    for count in range(1, len(cols) + 1):
        size = math.ceil(len(cols) / count)
        blocks = [cols[i:i + size] for i in range(0, len(cols), size)]
        if all(key + sum(widths[i] + 2 for i in b) - 2 <= width for b in blocks):
            return blocks or [[]]
    return [[c] for c in cols] or [[]]


def category_table(rows: list[dict], metrics: list[str], systems: list[str] | None = None,
                   wide: bool = False, width: int = 120, groups: list[Group] | None = None) -> str:
    """Plain-text per-category score table with 95% CIs.

    Args:
        rows: one dict per scored question (``results.jsonl`` rows from ``eval/runner.py``)
            with ``category`` (int), optional ``system`` (str, default ``"nemori"``) and one
            float in [0, 1] (or ``None``) per metric name. Category 5 rows are ignored.
        metrics: metric keys to show (header = metric name).
        systems: systems to show, in order; ``None`` → every system in order of appearance.
        wide: ``False`` → one row per (system, category), one column per metric;
            ``True`` → one row per category, one column per (metric, system), headed
            ``"<system> <metric>"`` (systems side by side for each metric).
        width: maximum line length; wider tables are split into column blocks
            (see :func:`format_table`).
        groups: row groups (default :data:`LOCOMO_GROUPS`; LongMemEval passes its question types).

    Returns:
        Rows for categories 1-4 (by name) and ``overall`` (categories 1-4 pooled). Each cell
        is :func:`format_cell`: ``"45.0 [30.1–59.9] (n=20)"`` = mean×100 [95% CI×100]; rows
        whose value is ``None`` (or missing) are skipped for that cell, so ``n`` counts only
        rows with a value.
    """
    systems = systems if systems is not None else _systems(rows)
    if wide:
        return _wide_table(rows, metrics, systems, width, groups)
    body: list[list[str]] = []
    for system in systems:
        for name, sub in scored_groups(rows, system, groups):
            body.append([system, name, *(format_cell(_values(sub, m)) for m in metrics)])
    return format_table(["system", "category", *metrics], body, key_cols=2, width=width)


def _wide_table(rows: list[dict], metrics: list[str], systems: list[str], width: int,
                groups: list[Group] | None = None) -> str:
    grouped = {s: dict(scored_groups(rows, s, groups)) for s in systems}
    names = [name for name, _ in (groups if groups is not None else LOCOMO_GROUPS)] + ["overall"]
    header = ["category", *(f"{s} {m}" for m in metrics for s in systems)]
    body = [[name, *(format_cell(_values(grouped[s][name], m)) for m in metrics for s in systems)]
            for name in names]
    return format_table(header, body, key_cols=1, width=width)


# ---------------------------------------------------------------- retrieval (LLM-free)

def norm_id(message_id: str) -> str:
    """A message id in canonical form: LoCoMo dia_ids via ``normalise_evidence`` ("D30:05" →
    "D30:5"); any other id (e.g. a UUID) unchanged."""
    found = normalise_evidence([message_id])
    return found[0] if len(found) == 1 else str(message_id)


_MALFORMED_DIA = re.compile(r"^D[\d:;\s]*$")


def _gold_ids(evidence: list[str]) -> list[str]:
    """Gold evidence ids, deduplicated: LoCoMo dia_ids normalised (malformed ones such as "D" or "D:11:26"
    dropped), any other id (e.g. LongMemEval's "answer_1:3") kept as is."""
    out: list[str] = []
    for raw in evidence:
        found = normalise_evidence([raw])
        out += found if found else ([] if _MALFORMED_DIA.match(str(raw).strip()) else [str(raw).strip()])
    return list(dict.fromkeys(out))


def evidence_recall_at_k(ranked_message_ids: list[list[str]], evidence: list[str], k: int) -> float | None:
    """Share of a question's gold evidence turns that the top-``k`` retrieved items contain.

    LLM-free retrieval metric (no judge, no answer): it only compares ids.

    Args:
        ranked_message_ids: one list per retrieved item, best first: the raw message ids
            of that item (a Nemori episode's ``Episode.message_ids`` from
            ``SearchResult.episodes``, or the ids of a RAG chunk's turns). For LoCoMo these
            are the turns' ``dia_id`` strings ("D1:3").
        evidence: the question's gold ``evidence`` dia_ids. They are normalised with
            ``eval.locomo.normalise_evidence`` (malformed ids split or dropped, leading zeros
            removed; see ``shared/data/locomo/README.md``) and deduplicated. Ids of another
            form (LongMemEval's ``"<session_id>:<turn>"``) are compared as they are.
        k: how many top items to look at (≥ 1); items beyond rank ``k`` are ignored.

    Returns:
        ``|evidence ∩ ids(top-k)| / |evidence|`` in [0, 1], or ``None`` when the normalised
        evidence is empty (so the question is excluded from means). A Full-Context system,
        whose single "item" holds every turn, scores 1 by construction (up to evidence ids
        that do not exist in the conversation).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    gold = _gold_ids(evidence)
    if not gold:
        return None
    seen = {norm_id(mid) for item in ranked_message_ids[:k] for mid in item}
    return sum(1 for g in gold if g in seen) / len(gold)


# ---------------------------------------------------------------- cost and latency tables

_USAGE_FIELDS = ("calls", "input_tokens", "output_tokens", "seconds", "cost_usd")


def usage_dict(usage: Any) -> dict[str, float]:
    """A ``types.Usage`` (or its ``model_dump()``) → plain dict; missing fields are 0."""
    raw = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
    return {f: float(raw.get(f, 0) or 0) for f in _USAGE_FIELDS}


def ordered_stages(stage_usage: dict[str, Any], stages_order: list[str] | None) -> list[str]:
    """Stages in ``stages_order`` that are present, then the others in their dict order."""
    first = [s for s in (stages_order or []) if s in stage_usage]
    return [*first, *(s for s in stage_usage if s not in first)]


def token_shares(stage_usage: dict[str, Any]) -> dict[str, float]:
    """``{stage: percent of all input+output tokens}``; sums to 100 (all 0.0 if no tokens)."""
    totals = {s: u["input_tokens"] + u["output_tokens"] for s, u in
              ((s, usage_dict(v)) for s, v in stage_usage.items())}
    grand = sum(totals.values())
    return {s: (100 * t / grand if grand else 0.0) for s, t in totals.items()}


def _money(cost: float, local: bool) -> str:
    return "local" if local and cost == 0 else f"{cost:.4f}"


def cost_table(stage_usage: dict[str, Any], stages_order: list[str] | None = None, local: bool = False) -> str:
    """Per-stage LLM cost table (the report's "Table 9" layout).

    Args:
        stage_usage: ``{stage: usage}``, usage a ``types.Usage`` or its ``model_dump()``
            (``calls``, ``input_tokens``, ``output_tokens``, ``seconds`` = summed wall
            seconds of the calls, ``cost_usd`` = dollars), e.g. ``RunSummary.usage`` from
            ``eval/runner.py`` / ``UsageLedger.snapshot()``.
        stages_order: stages to list first, in this order (e.g. ``runner.CONSTRUCTION_STAGES``);
            stages not named follow in dict order; named but absent stages are skipped.
        local: the model runs locally: a $ of 0 is shown as ``"local"``.

    Returns:
        Columns ``stage, calls, input, output, total, share %, seconds, $`` (total =
        input + output tokens; share = total / all stages' total × 100) and a ``total`` row.
    """
    stages = ordered_stages(stage_usage, stages_order)
    use = {s: usage_dict(stage_usage[s]) for s in stages}
    shares = token_shares(stage_usage)
    tot = {f: sum(u[f] for u in use.values()) for f in _USAGE_FIELDS}
    body = [_cost_line(s, use[s], shares[s], local) for s in stages]
    body.append(_cost_line("total", tot, 100.0 if tot["input_tokens"] + tot["output_tokens"] else 0.0, local))
    header = ["stage", "calls", "input", "output", "total", "share %", "seconds", "$"]
    return format_table(header, body, key_cols=1)


def _cost_line(name: str, u: dict[str, float], share: float, local: bool) -> list[str]:
    total = u["input_tokens"] + u["output_tokens"]
    return [name, f"{u['calls']:.0f}", f"{u['input_tokens']:.0f}", f"{u['output_tokens']:.0f}", f"{total:.0f}",
            f"{share:.1f}", f"{u['seconds']:.1f}", _money(u["cost_usd"], local)]


def _mean_of(rows: list[dict], key: str) -> str:
    vals = _values(rows, key)
    return f"{sum(vals) / len(vals):.1f}" if vals else "-"


def answer_time_table(rows: list[dict], systems: list[str] | None = None) -> str:
    """Per-system answering cost: context size and latency (the report's "Table 4" layout).

    Args:
        rows: ``results.jsonl`` rows (``eval/runner.py``): ``system``,
            ``context_tokens`` (tokens of the retrieved context; rows written before it
            existed fall back to ``answer_input_tokens``, the answer call's prompt tokens),
            optional ``search_ms`` (retrieval wall time, ms) and ``total_ms`` (search +
            answer wall time, ms). Missing/``None`` values are skipped per column.
        systems: systems to show, in order; ``None`` → all, in order of appearance.

    Returns:
        Columns ``system, n, context tokens, search ms, total ms`` (means, 1 decimal;
        ``-`` when no row has the value).
    """
    systems = systems if systems is not None else _systems(rows)
    body = []
    for system in systems:
        mine = [r for r in rows if _system(r) == system]
        key = "context_tokens" if any("context_tokens" in r for r in mine) else "answer_input_tokens"
        body.append([system, str(len(mine)), _mean_of(mine, key),
                     _mean_of(mine, "search_ms"), _mean_of(mine, "total_ms")])
    return format_table(["system", "n", "context tokens", "search ms", "total ms"], body, key_cols=1)


# ---------------------------------------------------------------- paired statistics (two systems, same questions)

PAIRED_METRICS = ["judge", "judge_strict", "f1", "bleu1", "recall_at_10"]
"""Metrics :func:`paired_stats` compares by default (those present in the rows); ``judge*`` are 0/1 scores."""

_BOOTSTRAP_CHUNK = 1000  # resamples drawn at once: bounds memory at chunk × n floats


def paired_bootstrap(a: list[float], b: list[float], n_resamples: int = 10_000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean paired difference ``mean(b − a)`` and its 95% percentile bootstrap CI.

    Args:
        a, b: one score per question, paired by position (same length n; e.g. judge 0/1 or F1 in [0, 1]).
        n_resamples: bootstrap resamples of the n question indices (drawn with replacement, the same indices
            for ``a`` and ``b``: the pairing is kept).
        seed: seed of ``numpy.random.default_rng`` (same inputs and seed → same interval).

    Returns:
        ``(mean_diff, low, high)`` in the scores' unit (a difference of [0, 1] scores lies in [-1, 1]); low/high
        are the 2.5th/97.5th percentiles of the resampled mean differences. Empty input → (0.0, 0.0, 0.0); one
        pair d → (d, d, d).

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or ``n_resamples`` < 1.
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if diff.size == 0:
        return 0.0, 0.0, 0.0
    mean = float(diff.mean())
    if diff.size == 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = np.concatenate([diff[rng.integers(0, diff.size, size=(min(_BOOTSTRAP_CHUNK, n_resamples - i), diff.size))]
                            .mean(axis=1) for i in range(0, n_resamples, _BOOTSTRAP_CHUNK)])
    low, high = np.percentile(means, [2.5, 97.5])
    return mean, float(low), float(high)


def mcnemar_exact(a_correct: list[bool], b_correct: list[bool]) -> float:
    """Exact two-sided McNemar p-value for two systems' right/wrong on the same questions.

    Only discordant pairs count: ``a_only`` = a right and b wrong, ``b_only`` = b right and a wrong. Under the
    null hypothesis each discordant pair is a fair coin, so p = min(1, 2 · P(X ≤ min(a_only, b_only))) with
    X ~ Binomial(a_only + b_only, 1/2) (the exact sum with ``math.comb``). No discordant pair → 1.0.

    Args:
        a_correct, b_correct: one bool (or 0/1) per question, paired by position.

    Returns:
        p in (0, 1].

    Raises:
        ValueError: the lists differ in length.
    """
    if len(a_correct) != len(b_correct):
        raise ValueError(f"paired outcomes need equal lengths, got {len(a_correct)} and {len(b_correct)}")
    a_only = sum(1 for x, y in zip(a_correct, b_correct) if bool(x) and not bool(y))
    b_only = sum(1 for x, y in zip(a_correct, b_correct) if bool(y) and not bool(x))
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def _binary(values: list[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def paired_compare(a: list[float], b: list[float], binary: bool | None = None, n_resamples: int = 10_000,
                   seed: int = 0) -> dict[str, Any]:
    """Paired comparison of two score lists (same questions, same order).

    Args:
        a, b: scores in [0, 1], paired by position (equal length).
        binary: add McNemar for 0/1 scores (``None``: when every value of both lists is 0 or 1).
        n_resamples, seed: of :func:`paired_bootstrap`.

    Returns:
        ``{"n", "mean_a", "mean_b", "diff", "low", "high"}`` (means and the ``b − a`` difference with its 95%
        bootstrap CI, all in the scores' unit, not ×100) and, when binary, ``"wins"`` (b right, a wrong),
        ``"losses"`` (a right, b wrong) and ``"mcnemar_p"`` (:func:`mcnemar_exact`).

    Raises:
        ValueError: the lists differ in length.
    """
    diff, low, high = paired_bootstrap(a, b, n_resamples, seed)
    n = len(a)
    out: dict[str, Any] = {"n": n, "mean_a": sum(a) / n if n else 0.0, "mean_b": sum(b) / n if n else 0.0,
                           "diff": diff, "low": low, "high": high}
    if binary if binary is not None else (n > 0 and _binary([*a, *b])):
        out.update(wins=sum(1 for x, y in zip(a, b) if y and not x),
                   losses=sum(1 for x, y in zip(a, b) if x and not y),
                   mcnemar_p=mcnemar_exact([bool(x) for x in a], [bool(y) for y in b]))
    return out


def paired_scores(rows: list[dict], system_a: str, system_b: str, metric: str,
                  groups: list[Group] | None = None) -> tuple[list[float], list[float]]:
    """The ``metric`` values of two systems on the questions both answered with a value, paired.

    Rows are paired by ``(sample_id, index)`` (LongMemEval rows: ``(question_id, 0)``); only rows in some group
    of ``groups`` (default :data:`LOCOMO_GROUPS`, categories 1-4, as the score tables) count, and a question
    is dropped when either system's value is missing or ``None``. Returns ``(a, b)`` in ``a``'s row order.
    """
    groups = groups if groups is not None else LOCOMO_GROUPS

    def by_question(system: str) -> dict[tuple[Any, Any], float]:
        return {(r.get("sample_id"), r.get("index")): float(r[metric]) for r in rows
                if _system(r) == system and r.get(metric) is not None and any(m(r) for _, m in groups)}

    a, b = by_question(system_a), by_question(system_b)
    keys = [k for k in a if k in b]
    return [a[k] for k in keys], [b[k] for k in keys]


def paired_stats(rows: list[dict], systems: list[str] | None = None, baseline: str | None = None,
                 metrics: list[str] | None = None, groups: list[Group] | None = None,
                 n_resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Every system against one baseline on the questions both answered (the dict form of :func:`paired_table`).

    Args:
        rows: ``results.jsonl`` rows (``system``, ``sample_id``, ``index``, ``category``, metric values).
        systems: systems to compare, in order (default: in order of appearance); ``baseline`` defaults to the
            first.
        metrics: default :data:`PAIRED_METRICS`; a metric no pair has a value for is left out. ``judge*``
            metrics (0/1) also get wins, losses and the exact McNemar p.
        groups: row groups the questions must belong to (default categories 1-4).
        n_resamples, seed: of :func:`paired_bootstrap`.

    Returns:
        ``{"baseline": name, "vs": {system: {metric: paired_compare(...)}}}`` (scores in [0, 1]); ``vs`` is
        empty with fewer than two systems.
    """
    systems = systems if systems is not None else _systems(rows)
    base = baseline if baseline is not None else (systems[0] if systems else "")
    out: dict[str, Any] = {"baseline": base, "vs": {}}
    for system in (s for s in systems if s != base):
        for metric in metrics if metrics is not None else PAIRED_METRICS:
            a, b = paired_scores(rows, base, system, metric, groups)
            if a:
                out["vs"].setdefault(system, {})[metric] = paired_compare(
                    a, b, binary=metric.startswith("judge") and _binary([*a, *b]), n_resamples=n_resamples, seed=seed)
    return out


def format_p(p: float | None) -> str:
    """A p-value as printed: 3 decimals, ``<0.001`` below that, ``-`` for None."""
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def paired_line(name: str, stats: dict[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    """One line for a printed report: ``"judge: B−A +12.5 [+2.5, +22.5] (n=40; 9 wins / 4 losses, McNemar
    p=0.267)"`` from :func:`paired_compare` (×100)."""
    s = stats
    mc = (f"; {s['wins']} {label_b} wins / {s['losses']} {label_a} wins, McNemar p={format_p(s['mcnemar_p'])}"
          if "mcnemar_p" in s else "")
    return (f"{name}: {label_b}−{label_a} {100 * s['diff']:+.1f} [{100 * s['low']:+.1f}, {100 * s['high']:+.1f}] "
            f"({label_a} {100 * s['mean_a']:.1f}, {label_b} {100 * s['mean_b']:.1f}, n={s['n']}{mc})")


def paired_table_from_stats(stats: dict[str, Any]) -> str:
    """:func:`paired_table`'s text from :func:`paired_stats`'s dict (e.g. ``RunSummary.paired``)."""
    base = stats["baseline"]
    body = []
    for system, by_metric in stats["vs"].items():
        for metric, s in by_metric.items():
            wl = f"{s['wins']}/{s['losses']}" if "wins" in s else "-"
            body.append([system, base, metric, str(s["n"]), f"{100 * s['mean_a']:.1f}", f"{100 * s['mean_b']:.1f}",
                         f"{100 * s['diff']:+.1f} [{100 * s['low']:+.1f}, {100 * s['high']:+.1f}]", wl,
                         format_p(s.get("mcnemar_p"))])
    if not body:
        return "(no system pair answered the same questions)"
    header = ["system B", "baseline A", "metric", "n", "A", "B", "B−A [95% CI]", "B wins/A wins", "McNemar p"]
    return format_table(header, body, key_cols=3)


def paired_table(rows: list[dict], systems: list[str] | None = None, baseline: str | None = None,
                 metrics: list[str] | None = None, groups: list[Group] | None = None,
                 n_resamples: int = 10_000, seed: int = 0) -> str:
    """Plain-text paired comparison of each system against ``baseline`` (default: the first system).

    Per (system, metric), over the questions both answered (:func:`paired_scores`): ``n``, each mean ×100, the
    difference B − A ×100 with its paired bootstrap 95% CI, and for the 0/1 judge the wins/losses (B right & A
    wrong / A right & B wrong) with the exact McNemar p (``-`` for other metrics). A CI that excludes 0 (or
    p < 0.05) is a difference these questions can tell; a CI that straddles 0 is not. Arguments as
    :func:`paired_stats`.
    """
    return paired_table_from_stats(paired_stats(rows, systems, baseline, metrics, groups, n_resamples, seed))
