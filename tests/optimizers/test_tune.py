"""Tuning construction stages: slices, stage records, evidence → episode labels, stage programs and
``nemori-dspy optimize`` end to end with a scripted LM (no network, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from nemori_dspy.apps.cli import main
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.locomo import load_locomo, parse_sessions, slice_sessions
from nemori_dspy.eval.runner import ingest_conversation
from nemori_dspy.errors import ConfigError, DatasetError
from nemori_dspy.memory import Memory
from nemori_dspy.optimizers.datasets import distill_examples, narrate_examples, observations_for, questions_for
from nemori_dspy.optimizers.programs import DistillProgram, NarrateProgram
from nemori_dspy.optimizers.tune import parse_stages
from nemori_dspy.recording import read_records, recording
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, chat_reply, default_responders, install_scripted_runtime

DATA = Path(__file__).resolve().parents[1] / "data" / "synthetic_locomo.json"


# ---------------------------------------------------------------- slices

def test_sessions_keep_exactly_those_turns_and_the_questions_inside():
    conv = load_locomo(DATA, ["conv-a"])[0]
    cut = slice_sessions(conv, parse_sessions("1-2"))
    assert [m.id for m in cut.messages] == [f"D1:{i}" for i in range(1, 7)] + [f"D2:{i}" for i in range(1, 5)]
    kept = {q.question for q in cut.questions}
    assert "Who visits Ben in July?" not in kept                      # evidence in session 3
    assert "What pet does Ada have and where does she live now?" in kept  # D1:1 and D2:1, both inside
    assert "What colour is the door?" in kept                          # malformed 'D' dropped, 'D2:03' = D2:3
    assert all(q.index == conv.questions[q.index].index for q in cut.questions)  # indices of the full file
    only2 = slice_sessions(conv, parse_sessions("2"))
    assert {q.question for q in only2.questions} == {"Where did Ada move?", "How many hours a day does Ben practise?",
                                                      "What colour is the door?"}
    assert slice_sessions(conv, None) is conv


@pytest.mark.parametrize("bad", ["0-2", "3-1", "a-b", "1-"])
def test_bad_sessions_name_the_flag(bad):
    with pytest.raises(DatasetError, match="--sessions"):
        parse_sessions(bad)


# ---------------------------------------------------------------- labels

def test_evidence_locates_questions_of_an_episode():
    conv = load_locomo(DATA, ["conv-a"])[0]
    qs = questions_for(conv, ["D1:1", "D1:2", "D1:3"])
    assert [q.question for q in qs] == ["What is the name of Ada's cat?", "When did Ada adopt her cat?",
                                        "What pet does Ada have and where does she live now?",
                                        "Would Ada enjoy a quiet pet?"]  # category 5 and other turns left out
    assert questions_for(conv, ["D3:4"]) == []


# ---------------------------------------------------------------- records

@pytest.fixture
def built(tmp_path):
    """conv-a and conv-b built with a scripted LM while recording stage calls."""
    lm = ScriptedLM(default_responders(groups_of=2))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        store = SQLiteStore(tmp_path / "m.db")
        memory = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=6, episode_split_gap_hours=None))
        convs = load_locomo(DATA, ["conv-a", "conv-b"])
        path = tmp_path / "m.stages.jsonl"
        with recording(path):
            for conv in convs:
                ingest_conversation(memory, conv, progress=False)
        yield memory, convs, path, lm
        store.close()


def test_construction_records_what_each_stage_saw_with_ids(built):
    memory, convs, path, _ = built
    narr = read_records(path, "narrate")
    assert narr and all(r.meta["user_id"] in {"conv-a", "conv-b"} and r.meta["message_ids"] for r in narr)
    ids = [i for r in narr if r.meta["user_id"] == "conv-a" for i in r.meta["message_ids"]]
    assert sorted(ids) == sorted(m.id for m in convs[0].messages)  # every turn narrated exactly once
    dist = read_records(path, "distill")
    assert dist and all(r.meta["episode_id"].startswith("ep_") and "known_before" in r.meta for r in dist)
    assert all("episode_messages" in r.inputs and "insights" in r.outputs for r in dist)


def test_stage_examples_carry_the_episode_labels(built):
    memory, convs, path, _ = built
    ex = narrate_examples(read_records(path), convs)
    assert ex and all(e.gold_answers for e in ex)
    first = next(e for e in ex if "Miso" in e.messages and "yesterday" in e.messages)
    assert "Miso" in first.gold_answers and "1 March 2023" in first.gold_answers
    assert set(first.inputs().keys()) == {"messages"}
    dex = distill_examples(read_records(path), convs)
    assert dex and set(dex[0].inputs().keys()) == {"episode_cue", "known_facts", "episode_messages",
                                                   "predicted_episode"}
    # an episode distilled with nothing evoked has no P_ant record: its cue comes from the distill record's meta
    from nemori_dspy.modules.semantic import NOTHING_PREDICTED

    skipped = [e for e in dex if e.predicted_episode == NOTHING_PREDICTED]
    assert skipped and all(e.known_facts == [] and e.episode_cue.startswith("(20") for e in skipped)


def test_replayed_records_are_read_once(tmp_path):
    from nemori_dspy.recording import StageRecorder, stage_meta

    rec = StageRecorder(tmp_path / "r.jsonl")
    with stage_meta(user_id="u"):
        rec.record("narrate", {"messages": "x"}, {"cue": "a", "narrative": "b"})
        rec.record("narrate", {"messages": "x"}, {"cue": "a2", "narrative": "b2"})  # crash + replay
    (tmp_path / "r.jsonl").open("a").write('{"stage": "narr')  # a write cut by a kill
    got = read_records(tmp_path / "r.jsonl")
    assert len(got) == 1 and got[0].outputs["cue"] == "a2"


# ---------------------------------------------------------------- programs

def _prompt_of(lm: ScriptedLM, name: str) -> str:
    return lm.history[-1]["messages"][0]["content"]


def test_loading_a_tuned_program_changes_that_stage_prompt_and_no_other(built, tmp_path):
    memory, convs, path, lm = built
    program = NarrateProgram(memory.pipeline)
    program.narrate.predict.signature = program.narrate.predict.signature.with_instructions("TUNED: be brief.")
    program.narrate.predict.demos = [dspy.Example(messages="[2023-01-01 10:00] A: hi", cue="c", narrative="n")]
    memory.pipeline.save(str(tmp_path / "tuned.json"))

    fresh_lm = ScriptedLM(default_responders(groups_of=2))
    with dspy.context(lm=fresh_lm, adapter=dspy.ChatAdapter()):
        store = SQLiteStore(tmp_path / "fresh.db")
        other = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=6, episode_split_gap_hours=None))
        before = {}
        other.add_messages("u", convs[1].messages[:6])
        for entry in fresh_lm.history:
            before.setdefault(fresh_lm.route(entry["messages"][0]["content"]), entry["messages"][0]["content"])
        other.pipeline.load(str(tmp_path / "tuned.json"))
        fresh_lm.history.clear()
        other.add_messages("v", convs[1].messages[:6])
        after = {}
        for entry in fresh_lm.history:
            after.setdefault(fresh_lm.route(entry["messages"][0]["content"]), entry["messages"][0]["content"])
        store.close()
    assert "TUNED: be brief." in after["NarrateEpisode"] and "TUNED" not in before["NarrateEpisode"]
    for name in before:
        if name != "NarrateEpisode":
            assert after[name] == before[name], name


def test_the_narrate_program_stores_what_the_pipeline_would_store(built):
    """What is tuned is what runs: the program's narrative is the reply polished as the pipeline polishes it before
    storing (repeats dropped, a sentence crediting the wrong speaker put right)."""
    memory = built[0]
    reply = ("Gina greeted Jon. Gina went to Paris last week with her sister. Gina greeted Jon. "
             "Gina greeted Jon.")
    lm = ScriptedLM({**default_responders(), "NarrateEpisode": lambda i: chat_reply(cue="Paris", narrative=reply)})
    rendered = "[2023-05-24 10:00] Jon: Hey Gina!\nJon: I went to Paris last week with my sister.\nGina: Wow!"
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = NarrateProgram(memory.pipeline)(messages=rendered)
    assert pred.narrative == "Gina greeted Jon. Jon went to Paris last week with her sister."


def test_distill_program_freezes_what_it_does_not_tune(built):
    memory = built[0]
    only = DistillProgram(memory.pipeline, ("distill",))
    assert [n for n, _ in only.named_predictors()] == ["distill.predict"]
    both = DistillProgram(memory.pipeline, ("anticipate", "distill"))
    assert sorted(n for n, _ in both.named_predictors()) == ["anticipate.predict", "distill.predict"]


def test_the_narrate_program_drops_echoes_of_the_demos_it_shows(built):
    """What is tuned is what runs: a bootstrapped demo is a demo; a narrative sentence restating it that the
    messages do not hold is dropped in the program as in the pipeline."""
    memory = built[0]
    program = NarrateProgram(memory.pipeline).deepcopy()
    demo = dspy.Example(messages="Caroline: Gonna continue my edu!", cue="Caroline's plans",
                        narrative="Melanie encourages her to continue her education and explore career options.")
    program.narrate.predict.demos = [demo]
    reply = ("Jon went to Paris last week with his sister. Melanie encourages her to continue her education and "
             "explore career options.")
    lm = ScriptedLM({**default_responders(), "NarrateEpisode": lambda i: chat_reply(cue="Paris", narrative=reply)})
    rendered = "[2023-05-24 10:00] Jon: Hey Gina!\nJon: I went to Paris last week with my sister.\nGina: Wow!"
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = program(messages=rendered)
    assert pred.narrative == "Jon went to Paris last week with his sister."


def test_the_distill_program_drops_what_only_the_prediction_says(built):
    """What is tuned is what runs: an insight P_dis copied from the prediction it was shown, which no message holds,
    is dropped in the program as in the pipeline (``insights_dropped.predicted_only``)."""
    memory = built[0]
    insights = ["Jon went to Paris last week with his sister.", "Jon is planning to adopt a puppy."]
    lm = ScriptedLM({**default_responders(), "DistillPredictionError": lambda i: chat_reply(insights=insights)})
    rendered = "[2023-05-24 10:00] Jon: Hey Gina!\nJon: I went to Paris last week with my sister.\nGina: Wow!"
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = DistillProgram(memory.pipeline)(
            episode_cue="(2023-05-24) Jon tells Gina about Paris", known_facts=[], episode_messages=rendered,
            predicted_episode="Jon tells Gina about Paris and plans to adopt a puppy.")
    assert pred.insights == insights[:1]


def test_apply_to_writes_a_compiled_copy_back(built):
    memory = built[0]
    copy = NarrateProgram(memory.pipeline).deepcopy()
    copy.narrate.predict.signature = copy.narrate.predict.signature.with_instructions("NEW")
    assert memory.pipeline.episodic.narrate.predict.signature.instructions != "NEW"
    copy.apply_to(memory.pipeline)
    assert memory.pipeline.episodic.narrate.predict.signature.instructions == "NEW"


def test_parse_stages_orders_and_refuses_partition():
    assert parse_stages("answer,narrate") == ["narrate", "answer"]
    with pytest.raises(ConfigError, match="partition has no stage metric"):
        parse_stages("partition")
    with pytest.raises(ConfigError, match="unknown stage"):
        parse_stages("narate")


# ---------------------------------------------------------------- the command

def _verbose_narrator(i: dict[str, str]) -> str:
    """Narrates by copying the messages, unless the instruction (carried in the inputs' demos) says otherwise:
    the scripted student 'learns' from demos, so optimization can move the score."""
    lines = i["messages"].splitlines()
    return chat_reply(cue=lines[0][:40], narrative=" ".join(lines))


@pytest.fixture
def scripted_runtime(monkeypatch, tmp_path, mlflow_db):  # mlflow_db: a migrated store at tmp_path/mlflow.db
    return install_scripted_runtime(monkeypatch, tmp_path / "cache", ScriptedLM(default_responders(groups_of=2)))


def _optimize(tmp_path, *extra):
    return main(["optimize", "--data", str(DATA), "--sessions", "1-2", "--train", "conv-a,conv-c", "--dev", "conv-b",
                 "--embedder", "hashing-64", "--window-size", "6", "--out", str(tmp_path / "opt"),
                 "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *extra])


def test_session_examples_are_what_p_nar_sees_when_a_session_is_one_episode(tmp_path):
    """With one episode per session (the default's shape on LoCoMo), a session example's input is exactly the text
    the pipeline sent P_nar for that episode, and its labels are the session's gold observations and questions."""
    from nemori_dspy.optimizers.datasets import narrate_session_examples

    settings = NemoriSettings(window_size=40, _env_file=None)
    lm = ScriptedLM(default_responders())
    conv = slice_sessions(load_locomo(DATA, ["conv-a"])[0], parse_sessions("1-2"))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        memory = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        with recording(tmp_path / "r.jsonl"):
            ingest_conversation(memory, conv, progress=False)
    seen = {tuple(r.meta["message_ids"]): r.inputs["messages"] for r in read_records(tmp_path / "r.jsonl")
            if r.stage == "narrate"}
    examples = narrate_session_examples([conv], settings, labelled_only=False)
    assert [e.session for e in examples] == [1, 2] and all(e.sample_id == "conv-a" for e in examples)
    whole = 0
    for ex in examples:
        ids = tuple(m.id for m in conv.messages if m.id.startswith(f"D{ex.session}:"))
        assert ex.observations == observations_for(conv, list(ids))
        if ids in seen:  # the scripted P_par kept this session as one episode (it split session 1)
            assert ex.messages == seen[ids]
            whole += 1
    assert whole >= 1


def test_session_examples_are_the_runs_p_nar_sees_when_it_narrates_in_runs(tmp_path):
    """With ``narrate_chunk_messages`` the examples are the runs the pipeline sends P_nar (what is tuned is what
    runs): each example's input is exactly one recorded P_nar prompt, its labels those of the run's messages."""
    from nemori_dspy.optimizers.datasets import narrate_session_examples

    settings = NemoriSettings(window_size=40, narrate_chunk_messages=3, _env_file=None)
    lm = ScriptedLM(default_responders(groups_of=100))  # P_par keeps each session as one episode
    conv = slice_sessions(load_locomo(DATA, ["conv-a"])[0], parse_sessions("1-2"))
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        memory = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
        with recording(tmp_path / "r.jsonl"):
            ingest_conversation(memory, conv, progress=False)
    seen = {r.inputs["messages"]: r.meta["message_ids"] for r in read_records(tmp_path / "r.jsonl")
            if r.stage == "narrate"}
    examples = narrate_session_examples([conv], settings, labelled_only=False)
    assert len(examples) == len(seen) > 2 and {e.run for e in examples} >= {1, 2}
    for ex in examples:
        assert ex.messages in seen
        assert ex.observations == observations_for(conv, list(seen[ex.messages]))


def test_optimize_narrate_on_sessions_builds_no_memory(tmp_path, scripted_runtime, capsys):
    assert _optimize(tmp_path, "--stage", "narrate", "--optimizer", "labeled", "--max-demos", "2", "--no-mlflow",
                     "--examples", "sessions") == 0
    out = capsys.readouterr().out
    assert "memory: not built" in out and "dev before" in out
    assert not any(scripted_runtime.calls.get(s, 0) for s in ("PartitionMessages", "DistillPredictionError"))
    result = json.loads((tmp_path / "opt/result.json").read_text())[0]
    assert result["n_train"] > 0 and result["n_dev"] > 0 and result["calls_on_train"] == {}
    assert main(["optimize", "--data", str(DATA), "--stage", "answer", "--examples", "sessions", "--train", "conv-a",
                 "--dev", "conv-b", "--no-mlflow", "--out", str(tmp_path / "x")]) == 2  # sessions is narrate's


def test_optimize_narrate_prints_before_after_and_saves_a_program_eval_loads(tmp_path, scripted_runtime, capsys):
    assert _optimize(tmp_path, "--stage", "narrate", "--optimizer", "labeled", "--max-demos", "2") == 0
    out = capsys.readouterr().out
    assert "dev before" in out and "dev after" in out and "(n=" in out and "program saved to" in out
    assert "student:" in out and "MLflow run" in out
    result = json.loads((tmp_path / "opt/result.json").read_text())
    assert result[0]["stage"] == "narrate" and result[0]["n_dev"] > 0
    assert result[0]["changes"]["narrate.predict"]["demos"] == 2
    state = json.loads((tmp_path / "opt/program.json").read_text())
    assert len(state["episodic.narrate.predict"]["demos"]) == 2 and not state["response.answer.predict"]["demos"]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.search_runs(experiment_names=["nemori-dspy-optimize"], output_format="list")[0]
    assert run.data.params["stages"] == "narrate" and run.data.params["train"] == "conv-a,conv-c"
    assert run.data.params["sessions"] == "1-2" and "narrate.dev.before" in run.data.metrics
    assert "prompt_version.episodic.narrate.predict" in run.data.params

    # the tuned program is what ships: eval --program on the same slice rebuilds (narrate changed) and runs
    narr = scripted_runtime.calls.get("NarrateEpisode", 0)
    assert main(["eval", "locomo", "--data", str(DATA), "--sessions", "1-2", "--conversations", "conv-b",
                 "--embedder", "hashing-64", "--window-size", "6", "--no-mlflow", "--no-judge",
                 "--program", str(tmp_path / "opt/program.json"), "--out", str(tmp_path / "ev")]) == 0
    assert scripted_runtime.calls["NarrateEpisode"] > narr


def test_optimize_reuses_the_memory_an_eval_of_the_slice_built(tmp_path, scripted_runtime, capsys):
    assert main(["eval", "locomo", "--data", str(DATA), "--sessions", "1-2", "--conversations",
                 "conv-a,conv-c,conv-b", "--embedder", "hashing-64", "--window-size", "6", "--no-mlflow",
                 "--no-judge", "--out", str(tmp_path / "ev")]) == 0
    narr = scripted_runtime.calls["NarrateEpisode"]
    capsys.readouterr()
    assert _optimize(tmp_path, "--stage", "answer", "--optimizer", "labeled", "--no-mlflow") == 0
    assert "reused (built and recorded by an earlier run)" in capsys.readouterr().out
    assert scripted_runtime.calls["NarrateEpisode"] == narr


def test_optimize_refuses_overlapping_train_and_dev(tmp_path, scripted_runtime, capsys):
    assert main(["optimize", "--data", str(DATA), "--stage", "narrate", "--train", "conv-a", "--dev", "conv-a"]) == 2
    assert "in both --train and --dev" in capsys.readouterr().err


def test_optimize_distill_with_gepa_runs_the_reflection_loop(tmp_path, scripted_runtime, capsys):
    reflections = []

    def propose(i):  # GEPA's reflection signature: current instruction + examples with feedback → new one
        reflections.append(i["examples_with_feedback"])
        return chat_reply(new_instruction="Extract only facts the prediction missed, one per line, absolute dates.")

    scripted_runtime.responders["GEPAProposeInstruction"] = propose
    assert _optimize(tmp_path, "--stage", "distill", "--optimizer", "gepa", "--max-metric-calls", "12",
                     "--no-mlflow", "--reflection-model", "none") == 0
    out = capsys.readouterr().out
    assert "[distill] dev before" in out and "[distill] dev after" in out
    assert reflections and "Answer coverage" in reflections[0]  # the metric's textual feedback reached the reflection


def test_end_to_end_mode_rebuilds_memory_per_candidate(tmp_path, scripted_runtime, capsys):
    assert _optimize(tmp_path, "--stage", "partition", "--metric", "end-to-end", "--optimizer", "labeled",
                     "--no-mlflow") == 0
    built = scripted_runtime.calls["NarrateEpisode"]
    out = capsys.readouterr().out
    assert "[partition] dev before" in out and "[partition] dev after" in out
    # conv-b rebuilt twice (dev before and after) on top of the 3 conversations built once for the records
    assert built > 0
    result = json.loads((tmp_path / "opt/result.json").read_text())
    assert result[0]["n_dev"] == 1 and result[0]["n_train"] == 2


def test_budget_flags_an_optimizer_ignores_are_reported(tmp_path, scripted_runtime, capsys):
    assert _optimize(tmp_path, "--stage", "answer", "--optimizer", "labeled", "--max-metric-calls", "30",
                     "--no-mlflow") == 0
    out = capsys.readouterr().out
    assert "note: --max-metric-calls has no effect with --optimizer labeled" in out
    assert "held-out check: nemori-dspy eval locomo --data" in out and "--sessions 1-2 --conversations conv-b" in out


# ---------------------------------------------------------------- test split, stage activity, answer metric

def test_optimize_scores_test_before_and_after_and_points_the_eval_at_it(tmp_path, scripted_runtime, capsys):
    assert main(["optimize", "--data", str(DATA), "--sessions", "1-2", "--train", "conv-a", "--dev", "conv-b",
                 "--test", "conv-c", "--embedder", "hashing-64", "--window-size", "6", "--out", str(tmp_path / "opt"),
                 "--stage", "narrate", "--optimizer", "labeled", "--max-demos", "2", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "test conv-c" in out and "test (conversations no optimizer step saw)" in out
    assert "dev (the optimizer selected on it: optimistic)" in out
    assert "--conversations conv-c --program" in out  # the held-out check runs on test, not on dev
    result = json.loads((tmp_path / "opt/result.json").read_text())[0]
    assert result["n_test"] > 0 and result["test_before"]["n"] == result["test_after"]["n"] == result["n_test"]
    assert result["paired_test"]["n"] == result["n_test"]
    assert result["calls_on_train"] == {"narrate": result["calls_on_train"]["narrate"]}
    assert result["calls_on_train"]["narrate"] > 0


def test_optimize_without_test_says_dev_is_not_held_out(tmp_path, scripted_runtime, capsys):
    assert _optimize(tmp_path, "--stage", "narrate", "--optimizer", "labeled", "--no-mlflow") == 0
    assert "note: no --test conversations" in capsys.readouterr().out


def test_mipro_and_gepa_select_on_dev_not_on_train(monkeypatch, tmp_path, scripted_runtime):
    from nemori_dspy.optimizers import optimize

    seen = {}

    def compile_(self, student, trainset, valset=None):
        seen.update(train={ex.sample_id for ex in trainset}, val={ex.sample_id for ex in valset})
        return student

    monkeypatch.setattr(optimize.Tuner, "compile", compile_)
    assert main(["optimize", "--data", str(DATA), "--sessions", "1-2", "--train", "conv-a", "--dev", "conv-b",
                 "--test", "conv-c", "--embedder", "hashing-64", "--window-size", "6", "--out", str(tmp_path / "o2"),
                 "--stage", "narrate", "--optimizer", "labeled", "--no-mlflow"]) == 0
    assert seen == {"train": {"conv-a"}, "val": {"conv-b"}}


@pytest.mark.parametrize("train,dev,test,flags", [(["a"], ["b"], ["b"], "--dev and --test"),
                                                   (["a"], ["b"], ["a"], "--train and --test")])
def test_split_refuses_a_conversation_in_two_splits(train, dev, test, flags):
    from nemori_dspy.optimizers.datasets import check_split

    with pytest.raises(ConfigError, match=flags):
        check_split(train, dev, test)


def test_split_names_the_slice_when_it_leaves_no_train():
    from nemori_dspy.optimizers.datasets import check_split

    with pytest.raises(ConfigError, match="--slice memory leaves no train conversation.*--train"):
        check_split([], ["conv-49"], slice_name="memory")


def _rec(stage, user):
    from nemori_dspy.recording import StageRecord

    return StageRecord(stage=stage, inputs={}, outputs={}, meta={"user_id": user})


def test_a_stage_the_train_build_never_called_is_refused_with_the_reason():
    from nemori_dspy.optimizers.tune import check_stage_ran

    records = [_rec("narrate", "conv-a"), _rec("distill", "conv-a"), _rec("anticipate", "conv-b")]
    assert check_stage_ran("distill", records, ["conv-a"]) == {"distill": 1}
    with pytest.raises(ConfigError, match="no anticipate call.*ANTICIPATE_WITHOUT_FACTS"):
        check_stage_ran("anticipate", records, ["conv-a"])  # conv-b's call is not on train
    with pytest.raises(ConfigError, match="no anticipate call"):
        check_stage_ran("anticipate+distill", records, ["conv-a"])
    with pytest.raises(ConfigError, match="no consolidate call.*CONSOLIDATION_MIN_SIMILARITY"):
        check_stage_ran("consolidate", records, ["conv-a"])
    assert check_stage_ran("consolidate", [_rec("consolidate_batch", "conv-a")], ["conv-a"]) == \
        {"consolidate": 0, "consolidate_batch": 1}
    assert check_stage_ran("answer", [], ["conv-a"]) == {}  # answers come from retrieval, not records


def test_optimize_refuses_consolidate_when_the_train_build_made_no_call(tmp_path, scripted_runtime, capsys,
                                                                      monkeypatch):
    assert _optimize(tmp_path, "--stage", "consolidate", "--optimizer", "labeled", "--no-mlflow") == 0
    assert "recorded calls on train: {'consolidate'" in capsys.readouterr().out  # the default build calls P_con
    # no fact clears a similarity floor above 1, so P_con is never called
    monkeypatch.setenv("NEMORI_CONSOLIDATION_MIN_SIMILARITY", "1.0")
    assert main(["optimize", "--data", str(DATA), "--sessions", "1-2", "--train", "conv-a,conv-c", "--dev", "conv-b",
                 "--embedder", "hashing-64", "--window-size", "6", "--out", str(tmp_path / "o2"), "--no-mlflow",
                 "--stage", "consolidate", "--optimizer", "labeled"]) == 2
    assert "recorded no consolidate call" in capsys.readouterr().err


def test_answer_stage_is_tuned_on_judge_and_f1_after_a_judge_audit(tmp_path, scripted_runtime, capsys):
    assert main(["optimize", "--data", str(DATA), "--sessions", "1-2", "--train", "conv-a", "--dev", "conv-b",
                 "--test", "conv-c", "--embedder", "hashing-64", "--window-size", "6", "--out", str(tmp_path / "opt"),
                 "--stage", "answer", "--optimizer", "labeled", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "answer metric judge+f1" in out and "judge audit on" in out and "gold → CORRECT" in out
    assert "paired judge:" in out and "paired f1:" in out
    result = json.loads((tmp_path / "opt/result.json").read_text())[0]
    for key in ("before", "after", "test_before", "test_after"):
        parts = result[key]["parts"]
        assert set(parts) == {"judge", "f1"} and len(parts["judge"]) == result[key]["n"]
        assert [0.5 * j + 0.5 * f for j, f in zip(parts["judge"], parts["f1"])] == pytest.approx(result[key]["scores"])


def test_a_judge_that_passes_wrong_answers_is_refused(tmp_path, scripted_runtime, capsys):
    scripted_runtime.responders["JudgeAnswer"] = lambda i: chat_reply(reasoning="fine", label="CORRECT")
    assert _optimize(tmp_path, "--stage", "answer", "--optimizer", "labeled", "--no-mlflow") == 2
    assert "labelled only 0% of the audit's wrong answers WRONG" in capsys.readouterr().err
    assert _optimize(tmp_path, "--stage", "answer", "--optimizer", "labeled", "--no-mlflow",
                     "--answer-metric", "f1") == 0  # token F1 alone is the user's explicit choice


def test_episode_labels_carry_the_gold_observations_of_its_turns():
    from nemori_dspy.optimizers.datasets import observations_for

    conv = load_locomo(DATA.parent / "synthetic_mini.json")[0]
    assert observations_for(conv, ["D1:3"]) == [
        "Noor made four lopsided bowls in her first pottery class, and one of them holds water."]
    assert len(observations_for(conv, ["D1:13", "D1:14"])) == 1  # one observation resting on two turns
    assert observations_for(load_locomo(DATA, ["conv-a"])[0], ["D1:1"]) == []  # a file without observations


def test_consolidate_cases_are_rendered_as_the_pipeline_renders_and_split_three_ways():
    from nemori_dspy.optimizers.datasets import consolidate_examples

    train, dev, test = (consolidate_examples(g) for g in "abc")
    assert len(train) >= 30 and len(dev) >= 30 and len(test) >= 30
    assert not {ex.insight for ex in train} & {ex.insight for ex in test}
    for ex in train + dev + test:  # render_fact's date prefix on both sides, render_entries' numbering
        assert ex.insight.startswith("(2024-06-01) ") and ex.existing_entries.startswith("[1] (2024-")
    assert {tuple(ex.targets) for ex in dev if ex.action != "new"} == {(1,), (2,)}  # targets vary
    assert {ex.action for ex in test} == {"new", "merge", "conflict"}
