"""The pipeline graph: stable predictor names, save/load of the whole program state, swapping a stage."""

from __future__ import annotations

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.modules.pipeline import NemoriPipeline
from nemori_dspy.modules.resources import Resources
from nemori_dspy.store.sqlite import SQLiteStore

NAMES = {
    "episodic.partition.predict", "episodic.narrate.predict", "episodic.select.predict",
    "episodic.integrate.predict", "semantic.anticipate.predict", "semantic.distill.predict",
    "semantic.consolidate.predict", "semantic.direct_distill.predict", "response.answer.predict",
}


def _pipeline(tmp_path, **settings):
    return NemoriPipeline(Resources(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(16), NemoriSettings(**settings)))


def test_predictor_names_are_stable(tmp_path):
    assert {name for name, _ in _pipeline(tmp_path).named_predictors()} == NAMES


def test_save_and_load_round_trip_instructions_and_demos(tmp_path):
    p = _pipeline(tmp_path)
    answer = dict(p.named_predictors())["response.answer.predict"]
    answer.signature = answer.signature.with_instructions("Answer tersely, with absolute dates.")
    answer.demos = [dspy.Example(context="c", question="q?", answer="a")]
    p.save(str(tmp_path / "program.json"))
    fresh = _pipeline(tmp_path)
    fresh.load(str(tmp_path / "program.json"))
    loaded = dict(fresh.named_predictors())["response.answer.predict"]
    assert loaded.signature.instructions == "Answer tersely, with absolute dates."
    assert loaded.demos[0]["answer"] == "a"


def test_a_stage_predictor_class_is_swapped_from_config(tmp_path):
    p = _pipeline(tmp_path, predictor_classes={"answer": "dspy.ChainOfThought"})
    assert isinstance(p.response.answer.predict, dspy.ChainOfThought)
    assert isinstance(p.episodic.narrate.predict, dspy.Predict)


def test_deepcopy_shares_the_store(tmp_path):
    import copy

    p = _pipeline(tmp_path)
    q = copy.deepcopy(p)
    assert q.res.store is p.res.store and q.response.answer is not p.response.answer
