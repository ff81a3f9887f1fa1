"""``eval.cost_estimate``: what a LoCoMo run will cost, from litellm's prices, before it runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.cost_estimate import estimate_locomo_cost, price
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore

PRICED = "openai/gpt-4o-mini"


def _rt(model=PRICED, judge=PRICED, **stage_models):
    lm = lambda name: SimpleNamespace(model=name)  # noqa: E731 - the estimate reads only .model
    return SimpleNamespace(settings=NemoriSettings(_env_file=None), lm=lm(model), judge_lm=lm(judge),
                           stage_lms={k: lm(v) for k, v in stage_models.items()})


@pytest.fixture
def pipeline(tmp_path):
    return Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings()).pipeline


def _estimate(conversations, pipeline, rt, systems=("nemori", "no-memory"), built=False, done=(), judges=("judge",),
              audit=10):
    return estimate_locomo_cost(conversations, [SYSTEMS[s] for s in systems], (1, 2, 3, 4), None, rt, pipeline,
                                lambda system, sid: built, set(done), list(judges), audit)


def test_a_priced_run_lists_each_phase_with_dollars(synthetic_mini, pipeline):
    est = _estimate(synthetic_mini, pipeline, _rt())
    by = {p.phase: p for p in est.phases}
    assert est.answers == 2 * 20 and est.turns_to_build == 56
    assert by["answer"].calls == 40 and by["judge"].calls == 40 + 2 * 10  # answers plus the audit's pairs
    assert {"construction: partition", "construction: narrate", "construction: distill"} <= set(by)
    assert all(p.cost_usd and p.cost_usd > 0 for p in est.phases) and est.priced
    # the memory system's answer prompt carries its 2,000-token context; no-memory's none
    assert by["answer"].input_tokens > 20 * 2000
    assert abs(est.total_usd - sum(p.cost_usd for p in est.phases)) < 1e-9
    text = est.text()
    assert "cost estimate before the run (56 turns to build, 40 answers" in text and f"{est.total_usd:.4f}" in text
    # litellm's price for these tokens
    assert by["answer"].cost_usd == pytest.approx(price(PRICED, by["answer"].input_tokens, by["answer"].output_tokens))


def test_reused_memory_and_resumed_answers_are_not_estimated(synthetic_mini, pipeline):
    q = synthetic_mini[0].questions[0]
    est = _estimate(synthetic_mini, pipeline, _rt(), built=True, done={("nemori", q.sample_id, q.index)})
    assert est.turns_to_build == 0 and not [p for p in est.phases if p.phase.startswith("construction")]
    assert est.answers == 39


def test_the_paper_configuration_costs_more_to_build(synthetic_mini, pipeline):
    paper = _estimate(synthetic_mini, pipeline, _rt(), systems=("nemori-paper",))
    ours = _estimate(synthetic_mini, pipeline, _rt(), systems=("nemori",))
    build = lambda e: sum(p.calls for p in e.phases if p.phase.startswith("construction"))  # noqa: E731
    assert build(paper) > build(ours) and "construction: consolidate" in {p.phase for p in paper.phases}


def test_local_models_are_unpriced(synthetic_mini, pipeline):
    est = _estimate(synthetic_mini, pipeline, _rt("openai/local", "openai/local"))
    assert not est.priced and est.text().startswith("cost estimate: unpriced (openai/local")
    mixed = _estimate(synthetic_mini, pipeline, _rt("openai/local", PRICED))  # a hosted judge over a local model
    assert mixed.priced and [p.phase for p in mixed.phases if p.cost_usd is not None] == ["judge"]
    assert "unpriced: openai/local" in mixed.text()
    assert price("openai/local", 1000, 100) is None and price(PRICED, 10**6, 0) == pytest.approx(0.15)


def test_both_judges_are_estimated_apart_and_no_judge_costs_nothing(synthetic_mini, pipeline):
    both = _estimate(synthetic_mini, pipeline, _rt(), judges=("judge", "judge_strict"), audit=0)
    judged = {p.phase: p for p in both.phases if p.phase.startswith("judge")}
    assert set(judged) == {"judge", "judge_strict"} and judged["judge"].calls == judged["judge_strict"].calls == 40
    assert judged["judge_strict"].input_tokens != judged["judge"].input_tokens  # each its own prompt
    assert [p.phase for p in _estimate(synthetic_mini, pipeline, _rt(), judges=()).phases if "judge" in p.phase] == []
