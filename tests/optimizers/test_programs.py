"""Stage programs reach every pipeline predictor that runs, the batched cost-switch stages included."""

from __future__ import annotations

from datetime import datetime, timedelta

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.optimizers.programs import PIPELINE_PATHS, StageProgram, pipeline_stage
from nemori_dspy.recording import read_records, recording
from nemori_dspy.signatures import SIGNATURES
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.testing import ScriptedLM, default_responders

BATCHED = {"narration_mode": "batched", "consolidation_mode": "batched", "consolidation_min_similarity": None}


class _SeeingLM(ScriptedLM):
    """Keeps the system messages too, to see which instruction actually ran."""

    def __init__(self, responders) -> None:
        super().__init__(responders)
        self.systems: list[str] = []

    def reply(self, system: str, user: str) -> str:
        self.systems.append(system)
        return super().reply(system, user)


def _messages(n: int, prefix: str = "D1", start: datetime = datetime(2023, 5, 8, 13, 0)) -> list[dict]:
    return [{"speaker": "A" if i % 2 else "B", "content": f"{prefix} talk {i}", "timestamp": start + timedelta(minutes=i),
             "id": f"{prefix}:{i}"} for i in range(1, n + 1)]


def _memory(tmp_path) -> Memory:
    return Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), NemoriSettings(window_size=20, **BATCHED))


def test_every_pipeline_stage_has_a_path():
    assert set(PIPELINE_PATHS) == {s for s in SIGNATURES if not s.startswith("judge")}


@pytest.mark.parametrize("stage", ["narrate_batch", "consolidate_batch"])
def test_the_predictor_a_program_tunes_is_the_one_that_runs(tmp_path, stage):
    mem = _memory(tmp_path)
    program = StageProgram(mem.pipeline, (stage,))
    predict = getattr(program, stage).predict
    predict.signature = predict.signature.with_instructions(f"TUNED {stage}")
    program.apply_to(mem.pipeline)
    assert pipeline_stage(mem.pipeline, stage) is getattr(program, stage)
    lm = _SeeingLM(default_responders())
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem.add_messages("u", _messages(20))
        mem.add_messages("u", _messages(20, "D2", datetime(2023, 5, 8, 14, 0)))
    assert lm.calls[SIGNATURES[stage].__name__] >= 1
    assert any(f"TUNED {stage}" in s for s in lm.systems)


def test_batched_stages_are_recorded_under_their_stage_names(tmp_path):
    mem = _memory(tmp_path)
    with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()), \
            recording(tmp_path / "records.jsonl"):
        mem.add_messages("u", _messages(20))
        mem.add_messages("u", _messages(20, "D2", datetime(2023, 5, 8, 14, 0)))
    stages = {r.stage for r in read_records(tmp_path / "records.jsonl")}
    assert {"narrate_batch", "consolidate_batch"} <= stages and "narrate" not in stages
    narr = read_records(tmp_path / "records.jsonl", stage="narrate_batch")[0]
    assert narr.inputs["group_count"] == 4 and len(narr.outputs["episodes"]) == 4 and narr.meta["message_ids"]


@pytest.mark.parametrize("stage", ["narrate", "consolidate"])
def test_tuning_a_stage_the_batched_switch_replaces_is_refused(tmp_path, stage):
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.optimizers.tune import stage_program

    with pytest.raises(ConfigError, match=f"{stage}_batch"):
        stage_program(stage, _memory(tmp_path).pipeline)
    paper = Memory(SQLiteStore(tmp_path / "p.db"), HashingEmbedder(64), NemoriSettings())
    assert stage_program(stage, paper.pipeline).tuned == (stage,)


def test_the_consolidate_program_settles_a_reply_as_the_pipeline_stores_it(tmp_path):
    """What is tuned is what runs: a merge the pipeline's merge checks refuse is scored as the 'new' it becomes."""
    from nemori_dspy.optimizers.tune import stage_program
    from nemori_dspy.testing import chat_reply

    paper = Memory(SQLiteStore(tmp_path / "p.db"), HashingEmbedder(64), NemoriSettings())
    program = stage_program("consolidate", paper.pipeline)
    entries = "[1] (2023-05-01) Caroline ran a charity race for mental health.\n[2] (2023-05-01) Caroline paints."
    replies = {"drops": chat_reply(action="merge", targets=[1, 7], merged_text="Caroline helped with the race."),
               "keeps": chat_reply(action="merge", targets=[1], merged_text="(2023-05-08) Caroline ran a charity "
                                   "race for mental health and went to an LGBTQ support group."),
               "range": chat_reply(action="conflict", targets=[9], merged_text="")}
    got = {}
    for name, reply in replies.items():
        with dspy.context(lm=ScriptedLM({"ConsolidateKnowledge": lambda i, r=reply: r})):
            got[name] = program(insight="(2023-05-08) Caroline went to an LGBTQ support group.", existing_entries=entries)
    assert (got["drops"].action, got["drops"].targets) == ("new", [])
    assert (got["keeps"].action, got["keeps"].targets) == ("merge", [1])
    assert got["keeps"].merged_text.startswith("Caroline ran")
    assert (got["range"].action, got["range"].targets) == ("new", [])
