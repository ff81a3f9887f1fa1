"""Metric tests on hand-computed examples (computation in the comments)."""

from __future__ import annotations

import math

import dspy
import pytest

from nemori_dspy.eval.metrics import (
    answer_time_table,
    bleu1,
    bleu1_metric,
    category_scores,
    category_table,
    cost_table,
    evidence_recall_at_k,
    format_cell,
    token_shares,
    f1_locomo,
    f1_locomo_metric,
    f1_metric,
    mean_ci95,
    token_f1,
)


# ------------------------------------------------------------------ token_f1 (mem0/Nemori)

def test_token_f1_exact_and_case_and_punctuation():
    # "Hello world." → {hello, world}; "hello world" → {hello, world}; P=R=1 → 1.0
    assert token_f1("Hello world.", "hello world") == pytest.approx(1.0)
    # "Paris, France!" → "paris  france " → {paris, france} == gold set → 1.0
    assert token_f1("Paris, France!", "paris france") == pytest.approx(1.0)


def test_token_f1_partial_uses_sets():
    # pred {the, cat, sat} (duplicates collapse), gold {the, cat}; common 2
    # P = 2/3, R = 2/2 = 1 → F1 = 2·(2/3)·1 / (2/3 + 1) = (4/3)/(5/3) = 0.8
    assert token_f1("the cat the cat sat", "the cat") == pytest.approx(0.8)
    # duplicates don't count twice: "cat cat" vs "cat" → {cat} vs {cat} → 1.0
    assert token_f1("cat cat", "cat") == pytest.approx(1.0)


def test_token_f1_empty_and_no_overlap():
    assert token_f1("", "paris") == 0.0
    assert token_f1("paris", "") == 0.0
    assert token_f1("...", "paris") == 0.0  # only punctuation → no tokens
    assert token_f1("london", "paris") == 0.0


def test_token_f1_int_answer_via_str():
    # gold int 2022 → "2022"; pred "In 2022." → {in, 2022}; P = 1/2, R = 1 → 2/3
    assert token_f1("2022", str(2022)) == pytest.approx(1.0)
    assert token_f1("In 2022.", 2022) == pytest.approx(2 / 3)


# ------------------------------------------------------------------ bleu1

def test_bleu1_exact_is_one():
    assert bleu1("I went to Paris", "i went to paris") == pytest.approx(1.0)


def test_bleu1_brevity_penalty():
    # pred tokens [paris] (c=1), gold [in, paris, france] (r=3)
    # clipped unigram precision = 1/1; BP = exp(1 - r/c) = exp(1 - 3) = exp(-2) ≈ 0.135335
    assert bleu1("Paris", "in Paris France") == pytest.approx(math.exp(-2))


def test_bleu1_partial_precision():
    # pred [paris, london] vs gold [paris, france]: 1 of 2 unigrams matches → p1 = 0.5,
    # c = r = 2 → BP = 1 → 0.5
    assert bleu1("paris london", "paris france") == pytest.approx(0.5)


def test_bleu1_no_overlap_or_empty_is_zero():
    assert bleu1("cat", "dog") == 0.0  # NLTK returns 0 when no unigram matches
    assert bleu1("", "dog") == 0.0
    assert bleu1("dog", "") == 0.0


# ------------------------------------------------------------------ f1_locomo (LoCoMo task_eval)

def test_f1_locomo_stemming():
    # Porter: running → run, runs → run → identical token lists → 1.0
    assert f1_locomo("running", "runs", 4) == pytest.approx(1.0)
    # token_f1 has no stemming: {running} vs {runs} → 0
    assert token_f1("running", "runs") == 0.0


def test_f1_locomo_articles_and_punctuation_removed():
    # "The cat and a dog!" → "cat dog" ; gold "cat, dog" → commas removed → "cat dog" → 1.0
    assert f1_locomo("The cat and a dog!", "cat, dog", 2) == pytest.approx(1.0)


def test_f1_locomo_multiset_overlap():
    # pred [cat, cat], gold [cat]: Counter overlap 1 → P = 1/2, R = 1 → F1 = 2/3
    assert f1_locomo("cat cat", "cat", 4) == pytest.approx(2 / 3)


def test_f1_locomo_category1_comma_list():
    # gold parts ["London", "Berlin"], pred parts ["Paris", "London"]
    # London: best over preds = 1.0 ; Berlin: 0.0 → mean 0.5
    assert f1_locomo("Paris, London", "London, Berlin", 1) == pytest.approx(0.5)
    # without the split (category 4) it is one list: [paris, london] vs [london, berlin]
    # overlap 1, P = R = 1/2 → 0.5 as well; a 3-part gold shows the difference:
    # gold parts "hiking", "painting", "swimming"; pred parts "hiking", "painting"
    # per gold part best: 1, 1, 0 → 2/3
    assert f1_locomo("hiking, painting", "hiking, painting, swimming", 1) == pytest.approx(2 / 3)


def test_f1_locomo_category3_cuts_gold_at_semicolon():
    # cat 3: gold → "Psychology" → [psycholog] vs [psycholog] → 1.0
    assert f1_locomo("psychology", "Psychology; counseling", 3) == pytest.approx(1.0)
    # cat 4 keeps both words: overlap 1, P = 1, R = 1/2 → 2/3
    assert f1_locomo("psychology", "Psychology; counseling", 4) == pytest.approx(2 / 3)


def test_f1_locomo_category5_phrases():
    assert f1_locomo("That is Not Mentioned in the conversation.", "", 5) == 1.0
    assert f1_locomo("No information available", "", 5) == 1.0
    assert f1_locomo("Yes, she did", "No", 5) == 0.0


def test_f1_locomo_int_answer():
    # int 2022 → "2022" → [2022] vs [2022] → 1.0
    assert f1_locomo("2022", 2022, 2) == pytest.approx(1.0)


# ------------------------------------------------------------------ DSPy-form metrics

def test_dspy_metrics():
    ex = dspy.Example(question="q", answer="7 May 2023", category=2).with_inputs("question")
    pred = dspy.Prediction(answer="7 May 2023")
    assert f1_metric(ex, pred) == pytest.approx(1.0)
    assert bleu1_metric(ex, pred) == pytest.approx(1.0)
    assert f1_locomo_metric(ex, pred, trace=None) == pytest.approx(1.0)
    # set F1: {on, 7, may, 2023} vs {7, may, 2023}: P = 3/4, R = 1 → 2·0.75/1.75 = 6/7
    assert f1_metric(ex, dspy.Prediction(answer="On 7 May 2023")) == pytest.approx(6 / 7)


def test_dspy_metrics_int_answer_and_category5():
    ex = dspy.Example(answer=str(2022), category=2)
    assert f1_locomo_metric(ex, dspy.Prediction(answer="2022")) == pytest.approx(1.0)
    adv = dspy.Example(answer="", category=5)
    assert f1_locomo_metric(adv, dspy.Prediction(answer="Not mentioned.")) == 1.0
    assert f1_metric(adv, dspy.Prediction(answer="Not mentioned.")) == 0.0  # empty gold


# ------------------------------------------------------------------ mean_ci95 / table

def test_mean_ci95():
    assert mean_ci95([]) == (0.0, 0.0, 0.0)
    assert mean_ci95([0.7]) == (0.7, 0.7, 0.7)
    # [0.4, 0.6, 0.5, 0.5]: mean 0.5; sample var = (0.01+0.01+0+0)/3 = 0.0066667
    # sd = 0.0816497; half = 1.96·0.0816497/√4 = 0.0800167 → (0.5, 0.4199833, 0.5800167)
    mean, low, high = mean_ci95([0.4, 0.6, 0.5, 0.5])
    assert mean == pytest.approx(0.5)
    assert low == pytest.approx(0.4199833, abs=1e-6)
    assert high == pytest.approx(0.5800167, abs=1e-6)
    # [0, 1]: half = 1.96·0.7071/√2 = 0.98 → (−0.48, 1.48) clipped to (0, 1)
    assert mean_ci95([0.0, 1.0]) == pytest.approx((0.5, 0.0, 1.0))


def test_format_cell_ci_and_n():
    # [0.4, 0.6, 0.5, 0.5]: mean 0.5, CI (0.41998, 0.58002) → ×100, 1 decimal
    assert format_cell([0.4, 0.6, 0.5, 0.5]) == "50.0 [42.0–58.0] (n=4)"
    # single value → zero-width interval
    assert format_cell([0.25]) == "25.0 [25.0–25.0] (n=1)"
    assert format_cell([]) == "- (n=0)"


ROWS = [
    {"category": 1, "f1": 1.0, "bleu1": 0.5},
    {"category": 1, "f1": 0.0, "bleu1": 0.5},
    {"category": 4, "f1": 0.5, "bleu1": 1.0},
    {"category": 5, "f1": 1.0, "bleu1": 1.0},  # excluded from the table
    {"category": 2, "f1": 0.25, "bleu1": 0.0, "system": "baseline"},
    {"category": 2, "f1": 0.75, "bleu1": None, "system": "baseline"},  # bleu1 skipped here
]


def test_category_table():
    table = category_table(ROWS, ["f1", "bleu1"])
    lines = table.splitlines()
    assert "f1" in lines[0] and "bleu1" in lines[0]
    # nemori multi-hop f1: [1, 0]: mean 0.5, sd 0.7071, half 1.96·0.7071/√2 = 0.98 → clipped [0, 1]
    assert any("nemori" in l and "multi-hop" in l and "50.0 [0.0–100.0] (n=2)" in l for l in lines)
    # nemori overall f1 [1, 0, 0.5]: mean 0.5, sd 0.5, half 1.96·0.5/√3 = 0.5658 → [0, 1]
    # bleu1 [0.5, 0.5, 1]: mean 0.6667, sd 0.2887, half 1.96·0.2887/√3 = 0.3267 → [34.0, 99.3]
    overall = next(l for l in lines if "nemori" in l and "overall" in l)
    assert "50.0 [0.0–100.0] (n=3)" in overall and "66.7 [34.0–99.3] (n=3)" in overall
    assert "adversarial" not in table
    # baseline temporal f1 [0.25, 0.75]: mean 0.5, sd 0.3536, half 0.49 → [1.0, 99.0]; bleu1 only [0.0]
    temporal = next(l for l in lines if "baseline" in l and "temporal" in l)
    assert "50.0 [1.0–99.0] (n=2)" in temporal and "0.0 [0.0–0.0] (n=1)" in temporal
    only = category_table(ROWS, ["f1"], systems=["baseline"])
    assert "nemori" not in only
    assert all(len(l) <= 120 for l in table.splitlines())


def test_category_table_wide_side_by_side():
    table = category_table(ROWS, ["f1"], systems=["nemori", "baseline"], wide=True)
    lines = table.splitlines()
    assert lines[0].split() == ["category", "nemori", "f1", "baseline", "f1"]
    assert len(lines) == 2 + 5  # header, rule, 4 categories + overall
    temporal = next(l for l in lines if l.startswith("temporal"))
    assert "- (n=0)" in temporal and "50.0 [1.0–99.0] (n=2)" in temporal


def test_category_table_wraps_to_width():
    metrics = ["judge", "f1", "bleu1", "f1_locomo", "recall"]
    rows = [{"category": c, "system": s, **{m: 0.5 for m in metrics}}
            for c in (1, 2, 3, 4) for s in ("nemori", "no-memory")]
    for wide in (False, True):
        table = category_table(rows, metrics, wide=wide)
        assert max(len(l) for l in table.splitlines()) <= 120
        for m in metrics:  # every column still shown, key columns repeated per block
            assert m in table
    assert sum(1 for l in category_table(rows, metrics).splitlines() if l.startswith("system")) >= 2


def test_category_scores():
    got = category_scores(ROWS, "f1")
    assert got["nemori"]["multi-hop"] == pytest.approx((0.5, 0.0, 1.0, 2))
    assert got["baseline"]["overall"][3] == 2
    assert got["baseline"]["single-hop"] == (0.0, 0.0, 0.0, 0)


# ------------------------------------------------------------------ evidence recall@k

def test_evidence_recall_at_k_cutoff_and_duplicates():
    ranked = [["D1:1", "D1:2"], ["D2:5"], ["D3:1", "D3:2"]]
    # evidence normalises to [D1:2, D3:1, D9:9] ("D1:2" twice and "D3:01" → "D3:1")
    evidence = ["D1:2", "D1:2", "D3:01", "D9:9"]
    # k=1: top item {D1:1, D1:2} holds D1:2 → 1/3
    assert evidence_recall_at_k(ranked, evidence, 1) == pytest.approx(1 / 3)
    # k=2: adds D2:5 (not gold) → still 1/3
    assert evidence_recall_at_k(ranked, evidence, 2) == pytest.approx(1 / 3)
    # k=3: adds D3:1 → 2/3 (D9:9 never retrieved)
    assert evidence_recall_at_k(ranked, evidence, 3) == pytest.approx(2 / 3)
    # k beyond the list behaves like k = len(list)
    assert evidence_recall_at_k(ranked, evidence, 10) == pytest.approx(2 / 3)


def test_evidence_recall_malformed_ids_and_full_context():
    # "D8:6; D9:17" splits into two ids; "D" is dropped → gold [D8:6, D9:17]
    assert evidence_recall_at_k([["D8:6"]], ["D8:6; D9:17", "D"], 5) == pytest.approx(0.5)
    # Full Context: one item holding every turn → 1 by construction
    all_turns = [[f"D{s}:{t}" for s in range(1, 4) for t in range(1, 20)]]
    assert evidence_recall_at_k(all_turns, ["D1:3", "D3:19"], 1) == 1.0
    # retrieved ids are normalised too ("D1:03" == "D1:3"); non-LoCoMo ids are kept as is
    assert evidence_recall_at_k([["D1:03", "uuid-1"]], ["D1:3"], 1) == 1.0
    assert evidence_recall_at_k([], ["D1:3"], 3) == 0.0


def test_evidence_recall_empty_evidence_is_none():
    assert evidence_recall_at_k([["D1:1"]], [], 3) is None
    assert evidence_recall_at_k([["D1:1"]], ["D"], 3) is None  # nothing left after normalising
    with pytest.raises(ValueError):
        evidence_recall_at_k([["D1:1"]], ["D1:1"], 0)


# ------------------------------------------------------------------ cost / answer-time tables

USAGE = {
    "narrate": {"calls": 2, "input_tokens": 600, "output_tokens": 150, "seconds": 3.0, "cost_usd": 0.0},
    "answer": {"calls": 4, "input_tokens": 200, "output_tokens": 50, "seconds": 1.5, "cost_usd": 0.0},
    "partition": {"calls": 1, "input_tokens": 0, "output_tokens": 0, "seconds": 0.0, "cost_usd": 0.0},
}


def test_token_shares_sum_to_100():
    # totals: narrate 750, answer 250, partition 0 → 1000 → 75 %, 25 %, 0 %
    shares = token_shares(USAGE)
    assert shares == pytest.approx({"narrate": 75.0, "answer": 25.0, "partition": 0.0})
    assert sum(shares.values()) == pytest.approx(100.0)
    assert token_shares({"x": {"calls": 1}}) == {"x": 0.0}


def test_cost_table_layout():
    table = cost_table(USAGE, stages_order=["partition", "narrate"], local=True)
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "calls", "input", "output", "total", "share", "%", "seconds", "$"]
    # order: named stages first, then the rest in dict order, then the total row
    assert [l.split()[0] for l in lines[2:]] == ["partition", "narrate", "answer", "total"]
    assert lines[3].split() == ["narrate", "2", "600", "150", "750", "75.0", "3.0", "local"]
    assert lines[5].split() == ["total", "7", "800", "200", "1000", "100.0", "4.5", "local"]
    paid = {"answer": {**USAGE["answer"], "cost_usd": 0.0123}}
    assert cost_table(paid).splitlines()[2].split()[-1] == "0.0123"
    assert cost_table({"a": USAGE["answer"]}, local=False).splitlines()[2].split()[-1] == "0.0000"


def test_cost_table_accepts_usage_models():
    from nemori_dspy.types import Usage

    table = cost_table({"answer": Usage(calls=1, input_tokens=10, output_tokens=5)})
    assert table.splitlines()[2].split()[:6] == ["answer", "1", "10", "5", "15", "100.0"]


def test_answer_time_table():
    rows = [
        {"system": "nemori", "answer_input_tokens": 1000, "search_ms": 20.0, "total_ms": 900.0},
        {"system": "nemori", "answer_input_tokens": 3000, "search_ms": 40.0, "total_ms": 1100.0},
        {"system": "no-memory", "answer_input_tokens": 100, "total_ms": 300.0},
    ]
    lines = answer_time_table(rows, ["nemori", "no-memory"]).splitlines()
    assert lines[0].split() == ["system", "n", "context", "tokens", "search", "ms", "total", "ms"]
    # nemori: tokens (1000+3000)/2 = 2000, search (20+40)/2 = 30, total (900+1100)/2 = 1000
    assert lines[2].split() == ["nemori", "2", "2000.0", "30.0", "1000.0"]
    assert lines[3].split() == ["no-memory", "1", "100.0", "-", "300.0"]


def test_answer_time_table_counts_context_tokens_even_for_cache_hits():
    # A cached answer call reports 0 prompt tokens; the context itself still has its size.
    rows = [
        {"system": "rag-4096", "context_tokens": 500, "answer_input_tokens": 0, "total_ms": 40.0},
        {"system": "rag-4096", "context_tokens": 700, "answer_input_tokens": 0, "total_ms": 60.0},
    ]
    lines = answer_time_table(rows, ["rag-4096"]).splitlines()
    assert lines[2].split() == ["rag-4096", "2", "600.0", "-", "50.0"]


def test_evidence_recall_keeps_ids_of_other_benchmarks_and_drops_malformed_dia_ids():
    from nemori_dspy.eval.metrics import evidence_recall_at_k

    ranked = [["answer_bike_1:1"], ["sharegpt_1:2", "answer_bike_1:3"]]
    assert evidence_recall_at_k(ranked, ["answer_bike_1:1", "answer_bike_1:3"], 1) == 0.5
    assert evidence_recall_at_k(ranked, ["answer_bike_1:1", "answer_bike_1:3"], 2) == 1.0
    assert evidence_recall_at_k([["D1:3"]], ["D1:03", "D", "D:11:26"], 1) == 1.0
