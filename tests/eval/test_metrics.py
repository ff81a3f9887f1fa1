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


# ------------------------------------------------------------------ paired statistics (issue 19)

def _rows(system: str, judge: list[float], f1: list[float] | None = None, sample: str = "c1") -> list[dict]:
    f1 = f1 if f1 is not None else [0.5] * len(judge)
    return [{"system": system, "sample_id": sample, "index": i, "category": 1 + i % 4, "judge": j, "f1": f}
            for i, (j, f) in enumerate(zip(judge, f1))]


def test_paired_bootstrap_is_seeded_and_brackets_the_mean_difference():
    from nemori_dspy.eval.metrics import paired_bootstrap

    a, b = [0, 1, 0, 1, 0, 0, 1, 0] * 5, [1, 1, 0, 1, 1, 0, 1, 1] * 5  # b − a: three +1 per 8 pairs
    mean, low, high = paired_bootstrap(a, b)
    assert mean == pytest.approx(3 / 8) and low < mean < high and 0 < low and high < 1
    assert paired_bootstrap(a, b) == (mean, low, high)  # same seed, same interval
    x, y = [0.1 * i for i in range(10)], [0.07 * i * i % 1 for i in range(10)]
    assert paired_bootstrap(x, y, seed=1) != paired_bootstrap(x, y, seed=2)  # the seed drives the resampling
    # a constant shift has no spread: the interval collapses onto it
    assert paired_bootstrap([0.2, 0.4, 0.6], [0.3, 0.5, 0.7]) == pytest.approx((0.1, 0.1, 0.1))
    assert paired_bootstrap([], []) == (0.0, 0.0, 0.0) and paired_bootstrap([0.0], [1.0]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="n_resamples"):
        paired_bootstrap([1.0], [1.0], n_resamples=0)


def test_paired_bootstrap_is_narrower_than_the_unpaired_intervals_when_scores_move_together():
    from nemori_dspy.eval.metrics import paired_bootstrap

    a = [0.1 * (i % 10) for i in range(60)]  # widely spread per question ...
    b = [x + 0.05 for x in a]  # ... and b is a little better on every one
    _, low, high = paired_bootstrap(a, b)
    _, la, ha = mean_ci95(a)
    assert high - low < 0.01 < ha - la


def test_mcnemar_exact_counts_only_discordant_pairs():
    from nemori_dspy.eval.metrics import mcnemar_exact

    # 10 discordant pairs all won by b: p = 2 · (1/2)^10
    assert mcnemar_exact([0] * 10 + [1] * 5, [1] * 10 + [1] * 5) == pytest.approx(2 / 1024)
    # 1 vs 1 discordant: p = min(1, 2 · P(X ≤ 1 | n=2)) = 1
    assert mcnemar_exact([True, False, True], [False, True, True]) == 1.0
    assert mcnemar_exact([1, 1], [1, 1]) == 1.0  # no discordant pair
    # 8 vs 2: 2 · (C(10,0)+C(10,1)+C(10,2)) / 1024 = 2 · 56 / 1024
    a = [1] * 2 + [0] * 8 + [1] * 3
    b = [0] * 2 + [1] * 8 + [1] * 3
    assert mcnemar_exact(a, b) == pytest.approx(112 / 1024)
    with pytest.raises(ValueError, match="equal lengths"):
        mcnemar_exact([True], [])


def test_mcnemar_exact_matches_scipy_binomtest():
    stats = pytest.importorskip("scipy.stats")
    from nemori_dspy.eval.metrics import mcnemar_exact

    for a_only, b_only in [(3, 9), (0, 4), (7, 7), (12, 1)]:
        a = [1] * a_only + [0] * b_only
        b = [0] * a_only + [1] * b_only
        assert mcnemar_exact(a, b) == pytest.approx(stats.binomtest(a_only, a_only + b_only, 0.5).pvalue)


def test_paired_stats_pairs_by_question_and_skips_unanswered_and_unscored_rows():
    from nemori_dspy.eval.metrics import paired_stats

    rows = _rows("nemori", [1, 1, 0, 0, 1], [0.8, 0.6, 0.0, 0.2, 1.0])
    rows += _rows("no-memory", [0, 1, 0, 1], [0.0, 0.6, 0.0, 0.4])  # question 4 unanswered
    rows.append({"system": "no-memory", "sample_id": "c1", "index": 9, "category": 5, "judge": 1.0, "f1": 1.0})
    rows.append({"system": "nemori", "sample_id": "c1", "index": 9, "category": 5, "judge": 0.0, "f1": 0.0})
    out = paired_stats(rows, ["nemori", "no-memory"])
    assert out["baseline"] == "nemori" and set(out["vs"]) == {"no-memory"}
    judge, f1 = out["vs"]["no-memory"]["judge"], out["vs"]["no-memory"]["f1"]
    assert judge["n"] == 4 and (judge["mean_a"], judge["mean_b"]) == (0.5, 0.5)  # questions 0-3 (category 5 out)
    assert (judge["wins"], judge["losses"], judge["mcnemar_p"]) == (1, 1, 1.0)
    assert "mcnemar_p" not in f1 and f1["diff"] == pytest.approx((0.0 + 0.0 + 0.0 + 0.2 - 0.8) / 4)
    assert paired_stats(rows, ["nemori"])["vs"] == {}  # one system: nothing to pair


def test_paired_table_shows_the_difference_with_its_ci_and_the_mcnemar_p():
    from nemori_dspy.eval.metrics import paired_table

    rows = _rows("nemori", [1] * 12 + [0] * 8) + _rows("no-memory", [0] * 12 + [0] * 8)
    text = paired_table(rows)
    line = next(l for l in text.splitlines() if l.startswith("no-memory") and " judge " in l)
    assert line.split()[:6] == ["no-memory", "nemori", "judge", "20", "60.0", "0.0"]
    assert "-60.0 [" in line and "0/12" in line and "<0.001" in line  # 2 · 2^-12 = 0.00049
    f1_line = next(l for l in text.splitlines() if " f1 " in l)
    assert "+0.0 [+0.0, +0.0]" in f1_line and f1_line.rstrip().endswith("-")
    assert "no system pair" in paired_table(_rows("nemori", [1]))


def test_paired_line_reads_as_a_sentence():
    from nemori_dspy.eval.metrics import paired_compare, paired_line

    s = paired_compare([0, 0, 1, 0], [1, 1, 1, 0])
    assert s["wins"] == 2 and s["losses"] == 0 and s["mcnemar_p"] == pytest.approx(0.5)
    text = paired_line("judge", s, "before", "after")
    assert text.startswith("judge: after−before +50.0 [") and "2 after wins / 0 before wins, McNemar p=0.500" in text
    assert "mcnemar_p" not in paired_compare([0.5, 0.2], [0.1, 0.9])  # not 0/1: no McNemar


# ------------------------------------------------------------------ stratified --max-questions (issue 19)

def _questions(categories: list[int]):
    from nemori_dspy.eval.locomo import LoCoMoQuestion

    return [LoCoMoQuestion(sample_id="c", index=i, question=f"q{i}", category=c) for i, c in enumerate(categories)]


def test_stratified_questions_deal_round_robin_over_categories_in_question_order():
    from nemori_dspy.eval.locomo import stratified_questions

    qs = _questions([4, 4, 4, 4, 4, 4, 2, 2, 1, 3, 3, 3])
    picked = stratified_questions(qs, 6)
    # one of each of 1,2,3,4, then again 2,3 (1 is exhausted, 4 comes after 3 in the second round)
    assert [q.index for q in picked] == [0, 6, 7, 8, 9, 10]
    assert [q.index for q in stratified_questions(qs, 8)] == [0, 1, 6, 7, 8, 9, 10, 11]
    # the leftover share of small categories goes to the categories with questions left
    assert sorted(q.category for q in stratified_questions(qs, 10)) == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    assert stratified_questions(qs, None) == qs and stratified_questions(qs, 50) == qs
    assert stratified_questions(qs, 0) == []
    with pytest.raises(ValueError):
        stratified_questions(qs, -1)


def test_stratified_questions_take_each_category_evenly_where_a_prefix_would_not():
    from collections import Counter

    from nemori_dspy.eval.locomo import stratified_questions

    qs = _questions([1] * 30 + [2] * 30 + [3] * 10 + [4] * 30)
    counts = Counter(q.category for q in stratified_questions(qs, 20))
    assert counts == {1: 5, 2: 5, 3: 5, 4: 5}  # a prefix [:20] would be all category 1


# ------------------------------------------------------------------ optimize before/after, paired (issue 19)

def test_optimize_prints_the_dev_before_after_difference_paired_per_example(capsys, tmp_path):
    from nemori_dspy.apps.cli.optimize import print_results
    from nemori_dspy.optimizers.optimize import DevScore
    from nemori_dspy.optimizers.tune import StageResult

    def dev(scores):
        return DevScore(**dict(zip(("mean", "low", "high"), mean_ci95(scores))), n=len(scores), scores=scores)

    before, after = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    r = StageResult("answer", 10, 6, dev(before), dev(after), {}, {}, 1.0)
    assert r.to_dict()["paired"]["wins"] == 3 and r.to_dict()["paired"]["diff"] == pytest.approx(0.5)
    print_results([r], tmp_path, 60.0, {})
    out = capsys.readouterr().out
    assert "paired: after−before +50.0 [" in out and "3 after wins / 0 before wins, McNemar p=0.250" in out
