"""Metric tests on hand-computed examples (computation in the comments)."""

from __future__ import annotations

import math

import dspy
import pytest

from nemori_dspy.eval.metrics import (
    bleu1,
    bleu1_metric,
    category_table,
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


def test_category_table():
    rows = [
        {"category": 1, "f1": 1.0, "bleu1": 0.5},
        {"category": 1, "f1": 0.0, "bleu1": 0.5},
        {"category": 4, "f1": 0.5, "bleu1": 1.0},
        {"category": 5, "f1": 1.0, "bleu1": 1.0},  # excluded from the table
        {"category": 2, "f1": 0.25, "bleu1": 0.0, "system": "baseline"},
    ]
    table = category_table(rows, ["f1", "bleu1"])
    lines = table.splitlines()
    assert "f1" in lines[0] and "bleu1" in lines[0]
    assert "n=" in table
    # nemori multi-hop f1: (1.0 + 0.0)/2 = 50.0 over 2 rows
    assert any("nemori" in l and "multi-hop" in l and "50.0 (n=2)" in l for l in lines)
    # nemori overall f1: (1 + 0 + 0.5)/3 = 0.5 → "50.0 (n=3)"; bleu1 (0.5+0.5+1)/3 = 66.7
    overall = next(l for l in lines if "nemori" in l and "overall" in l)
    assert "50.0 (n=3)" in overall and "66.7 (n=3)" in overall
    assert "adversarial" not in table
    assert any("baseline" in l and "temporal" in l and "25.0 (n=1)" in l for l in lines)
    only = category_table(rows, ["f1"], systems=["baseline"])
    assert "nemori" not in only
