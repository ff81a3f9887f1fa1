"""The pipeline graph: stable predictor names, save/load of the whole program state, swapping a stage."""

from __future__ import annotations

from datetime import datetime, timedelta

import json

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.insight_rules import message_lines
from nemori_dspy.memory import Memory
from nemori_dspy.modules.pipeline import NemoriPipeline, closed_segments, stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.types import StoredMessage
from tests.fakes import ScriptedLM, chat_reply, default_responders

NAMES = {
    "episodic.partition.predict", "episodic.narrate.predict", "episodic.select.predict",
    "episodic.integrate.predict", "semantic.anticipate.predict", "semantic.distill.predict",
    "semantic.consolidate.predict", "response.answer.predict",
}


def _pipeline(tmp_path, **settings):
    return NemoriPipeline(Resources(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(16), NemoriSettings(**settings)))


def test_predictor_names_are_stable(tmp_path):
    assert {name for name, _ in _pipeline(tmp_path).named_predictors()} == NAMES


def test_batched_switches_add_their_predictors(tmp_path):
    batched = _pipeline(tmp_path, narration_mode="batched", consolidation_mode="batched")
    assert {name for name, _ in batched.named_predictors()} == NAMES | {
        "episodic.narrate_batch.predict", "semantic.consolidate_batch.predict"}


def test_only_the_predictors_a_configuration_runs_are_in_the_program(tmp_path):
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.modules.pipeline import pipeline_stage
    from nemori_dspy.stages import PIPELINE_PATHS

    direct = _pipeline(tmp_path, distillation="direct", consolidation=False)
    names = {name for name, _ in direct.named_predictors()}
    assert names == NAMES - {"semantic.anticipate.predict", "semantic.distill.predict",
                             "semantic.consolidate.predict"} | {"semantic.direct_distill.predict"}
    assert {n.rsplit(".", 1)[0] for n in names} <= set(PIPELINE_PATHS.values())
    assert pipeline_stage(direct, "direct_distill") is direct.semantic.direct_distill
    with pytest.raises(ConfigError, match="'distill' is not run by this configuration"):
        pipeline_stage(direct, "distill")
    direct.save(str(tmp_path / "direct.json"))
    assert not any(k.startswith(("semantic.distill", "semantic.anticipate", "semantic.consolidate"))
                   for k in json.loads((tmp_path / "direct.json").read_text()))


def test_a_program_saved_with_more_stages_loads_into_one_that_runs_fewer(tmp_path):
    full = _pipeline(tmp_path)
    full.save(str(tmp_path / "full.json"))
    _pipeline(tmp_path, consolidation=False).load(str(tmp_path / "full.json"))


def test_a_program_lacking_a_predictor_this_configuration_runs_is_refused_by_name(tmp_path):
    from nemori_dspy.errors import ConfigError

    _pipeline(tmp_path, distillation="direct").save(str(tmp_path / "direct.json"))
    with pytest.raises(ConfigError, match="no state for semantic.anticipate.predict, semantic.distill.predict"):
        _pipeline(tmp_path).load(str(tmp_path / "direct.json"))


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


# --- re-distilling what memory already holds adds no duplicate facts

def _one_fact_per_message():
    """Responders: one fact per message line ('<speaker> said: <text>'), P_con always 'new'."""
    responders = default_responders(groups_of=10)
    responders["DistillPredictionError"] = lambda i: chat_reply(
        insights=[f"{who} said: {text}" for who, text in message_lines(i["episode_messages"])])
    responders["ConsolidateKnowledge"] = lambda i: chat_reply(action="new", targets=[], merged_text="")
    return responders


def _talk(n, start, prefix):
    return [{"speaker": "Caroline" if i % 2 else "Melanie", "content": f"{prefix} fact number {i}",
             "timestamp": start + timedelta(minutes=i), "id": f"{prefix}:{i}"} for i in range(1, n + 1)]


def test_a_merged_episode_re_distilled_adds_only_the_new_facts(tmp_path):
    responders = _one_fact_per_message()
    responders["SelectContinuation"] = lambda i: chat_reply(choice=1)
    with dspy.context(lm=ScriptedLM(responders), adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
        mem.add_messages("u", _talk(10, datetime(2023, 5, 8, 13, 0), "A"))
        mem.add_messages("u", _talk(10, datetime(2023, 5, 8, 14, 0), "B"))
    assert len(mem.list_episodes("u")) == 1  # the second window merged into the first
    texts = [e.text for e in mem.list_semantic("u")]
    assert len(texts) == len(set(texts)) == 20


def test_a_conversation_re_sent_under_new_ids_adds_no_facts(tmp_path):
    with dspy.context(lm=ScriptedLM(_one_fact_per_message()), adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=10))
        talk = _talk(10, datetime(2023, 5, 8, 13, 0), "A")
        mem.add_messages("u", talk)
        before = sorted(e.text for e in mem.list_semantic("u"))
        mem.add_messages("u", [{**m, "id": "again-" + m["id"]} for m in talk])
        assert mem.status("u").to_distill == 0
    assert sorted(e.text for e in mem.list_semantic("u")) == before and len(before) == 10


def test_a_stage_flat_management_does_not_run_is_named_not_an_attribute_error(tmp_path):
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.modules.pipeline import pipeline_stage

    flat = _pipeline(tmp_path, semantic_management="flat")
    assert pipeline_stage(flat, "summarize") is flat.semantic.summarize
    with pytest.raises(ConfigError, match="'consolidate' is not run by this configuration"):
        pipeline_stage(flat, "consolidate")


def test_a_program_saved_before_the_batched_stages_existed_still_loads(tmp_path):
    import json

    saved = _pipeline(tmp_path)
    saved.episodic.narrate.predict.signature = saved.episodic.narrate.predict.signature.with_instructions("TUNED")
    saved.save(str(tmp_path / "program.json"))
    old = json.loads((tmp_path / "program.json").read_text())
    assert not any("_batch" in k for k in old)  # the default configuration runs no batched stage
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "x").mkdir()
    fresh = _pipeline(tmp_path / "x", narration_mode="batched", consolidation_mode="batched")
    fresh.load(str(tmp_path / "old.json"))
    assert fresh.episodic.narrate.predict.signature.instructions == "TUNED"


# --- a window ends at its last time gap (hold_open_segment)

def _msgs_at(hours: list[float]) -> list[StoredMessage]:
    t0 = datetime(2023, 5, 8, 9, 0)
    return [StoredMessage(user_id="u", id=f"m{i}", seq=i, speaker="A", content="hi",
                          timestamp=t0 + timedelta(hours=h)) for i, h in enumerate(hours)]


@pytest.mark.parametrize("hours,hold,formed", [
    ([0, 0.1, 0.2, 30, 30.1], True, 3),          # the run after the last gap waits
    ([0, 0.1, 30, 30.1, 60, 60.1], True, 4),     # only the last run waits; earlier gaps form as before
    ([0, 0.1, 0.2, 0.3], True, 4),               # no gap: the window forms whole
    ([0, 0.1, 0.2, 30, 30.1], False, 5),         # nothing may follow (a flush of the last messages): all form
])
def test_closed_segments_form_the_window_up_to_its_last_gap(hours, hold, formed):
    window = _msgs_at(hours)
    assert closed_segments(window, NemoriSettings(), hold) == window[:formed]
    assert closed_segments(window, NemoriSettings(hold_open_segment=False), hold) == window  # the paper's


def test_seed_demos_start_every_memory_stage_but_partition_and_are_off_in_the_paper_configuration():
    from nemori_dspy.config import PAPER_FAITHFUL
    from nemori_dspy.signatures.demos import SEED_DEMOS

    make = stage_factory(NemoriSettings(_env_file=None))
    for stage in ("narrate", "distill", "anticipate", "consolidate", "direct_distill"):
        (predictor,) = [p for _, p in make(stage).named_predictors()]
        assert len(predictor.demos) == len(SEED_DEMOS[stage]) > 0, stage
    assert [p.demos for _, p in make("partition").named_predictors()] == [[]]
    paper = stage_factory(NemoriSettings(**PAPER_FAITHFUL, _env_file=None))
    assert [p.demos for _, p in paper("narrate").named_predictors()] == [[]]


def test_seed_demos_hold_every_field_of_their_signature():
    from nemori_dspy.signatures import SIGNATURES
    from nemori_dspy.signatures.demos import SEED_DEMOS

    for stage, demos in SEED_DEMOS.items():
        fields = set(SIGNATURES[stage].input_fields) | set(SIGNATURES[stage].output_fields)
        assert all(set(d.toDict()) == fields for d in demos), stage
