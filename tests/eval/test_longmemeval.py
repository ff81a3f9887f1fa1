"""LongMemEval loader and per-type judge tests, on a tiny file in the official schema written here."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path

import dspy
import pytest

from nemori_dspy.errors import DatasetError, InvalidInputError
from nemori_dspy.eval.longmemeval import (
    QUESTION_TYPES,
    LongMemEvalQuestion,
    load_longmemeval,
    parse_longmemeval_date,
)
from nemori_dspy.eval.longmemeval_judge import (
    LONGMEMEVAL_JUDGE_PROMPT_HASH,
    LongMemEvalJudge,
    judge_signature,
    question_example,
    summarise_accuracy,
)
from nemori_dspy.signatures import signature_hash
from nemori_dspy.signatures.longmemeval import (
    JudgeLongMemEvalAbstention,
    JudgeLongMemEvalDefault,
    JudgeLongMemEvalKnowledgeUpdate,
    JudgeLongMemEvalPreference,
    JudgeLongMemEvalTemporal,
)
from tests.fakes import LongMemEvalLM, chat_reply
from tests.fakes import longmemeval_questions as _questions
from tests.fakes import write_json as _write

# ------------------------------------------------------------------ a tiny official-schema file


@pytest.fixture
def qs(tmp_path) -> list[LongMemEvalQuestion]:
    return load_longmemeval(_write(tmp_path, _questions()))


# ------------------------------------------------------------------ loader


def test_loads_all_questions_in_file_order(qs):
    assert [q.question_id for q in qs] == ["q-temporal", "q-pref", "q-ku_abs"]
    assert [q.question_type for q in qs] == ["temporal-reasoning", "single-session-preference", "knowledge-update"]
    assert [len(q.messages) for q in qs] == [5, 4, 2]  # q-pref has one blank turn skipped
    assert all(q.user_id == q.question_id for q in qs)  # one memory per question
    assert len({q.user_id for q in qs}) == 3


def test_question_fields(qs):
    t, p, a = qs
    assert t.answer == "3"  # int → str
    assert t.question_date == datetime(2023, 5, 30, 23, 40)
    assert p.question_date == datetime(2023, 6, 2, 9, 0)
    assert t.answer_session_ids == ["answer_bike_1"]
    assert a.answer_session_ids == ["answer_pet_1", "answer_pet_2"]
    assert [q.is_abstention for q in qs] == [False, False, True]
    dumped = a.model_dump()
    assert dumped["is_abstention"] is True and dumped["user_id"] == "q-ku_abs"


def test_messages_ids_speakers_and_session_timestamps(qs):
    t = qs[0]
    assert [m.id for m in t.messages] == [
        "sharegpt_noise_1:1", "sharegpt_noise_1:2", "answer_bike_1:1", "answer_bike_1:2", "answer_bike_1:3"]
    assert [m.speaker for m in t.messages] == ["user", "assistant", "user", "assistant", "user"]
    # every turn takes its session's date (no per-turn offsets)
    assert {m.timestamp for m in t.messages[:2]} == {datetime(2023, 5, 20, 2, 21)}
    assert {m.timestamp for m in t.messages[2:]} == {datetime(2023, 5, 25, 14, 5)}
    assert t.messages[2].content == "I bought a bike on May 22."
    assert t.haystack_session_ids == ["sharegpt_noise_1", "answer_bike_1"]


def test_blank_turn_skipped_but_numbering_kept(qs):
    p = qs[1]
    assert [m.id for m in p.messages] == ["answer_hike_1:1", "answer_hike_1:2", "ultrachat_2:1", "ultrachat_2:3"]


def test_unsorted_sessions_are_sorted_by_date(qs):
    a = qs[2]
    assert a.haystack_session_ids == ["answer_pet_1", "answer_pet_2"]
    assert [m.content for m in a.messages] == ["I adopted a dog named Max.", "The dog is now called Rex."]
    assert [m.timestamp.date().isoformat() for m in a.messages] == ["2023-06-10", "2023-06-20"]


def test_evidence_ids_from_has_answer(qs):
    t, p, a = qs
    assert t.evidence == ["answer_bike_1:1", "answer_bike_1:3"]
    assert p.evidence == ["answer_hike_1:1"]
    assert a.evidence == []
    ids = {m.id for m in t.messages}
    assert set(t.evidence) <= ids


def test_filters(tmp_path):
    path = _write(tmp_path, _questions())
    assert [q.question_id for q in load_longmemeval(path, ["q-ku_abs", "q-temporal"])] == ["q-ku_abs", "q-temporal"]
    assert [q.question_id for q in load_longmemeval(path, question_types=["knowledge-update"])] == ["q-ku_abs"]
    assert load_longmemeval(path, ["q-pref"], question_types=["temporal-reasoning"]) == []


def test_constants_and_date_parser():
    assert len(QUESTION_TYPES) == 6 and "temporal-reasoning" in QUESTION_TYPES
    assert parse_longmemeval_date("2023/05/30 (Tue) 23:40") == datetime(2023, 5, 30, 23, 40)
    assert parse_longmemeval_date("2023-05-30T23:40:00") == datetime(2023, 5, 30, 23, 40)
    with pytest.raises(InvalidInputError):
        parse_longmemeval_date("not a date")


def test_duplicate_session_ids_get_unique_message_ids(tmp_path):
    q = _questions()[0]
    q["haystack_session_ids"] = ["s", "s"]
    (loaded,) = load_longmemeval(_write(tmp_path, [q]))
    ids = [m.id for m in loaded.messages]
    assert len(set(ids)) == len(ids) and ids[2] == "s#2:1"


# ------------------------------------------------------------------ loader errors


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.json.*not found.*Fix"):
        load_longmemeval(tmp_path / "nope.json")


def test_bad_json_and_wrong_shape(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_longmemeval(bad)
    with pytest.raises(DatasetError, match="list of question objects"):
        load_longmemeval(_write(tmp_path, {"questions": [], "answers": []}, "mod.json"))


@pytest.mark.parametrize("key", ["haystack_sessions", "question_date", "answer"])
def test_missing_keys(tmp_path, key):
    data = _questions()
    del data[1][key]
    with pytest.raises(DatasetError, match=rf"q-pref.*'{key}'"):
        load_longmemeval(_write(tmp_path, data))


def test_mismatched_haystack_lists_and_bad_dates(tmp_path):
    data = _questions()
    data[0]["haystack_dates"] = data[0]["haystack_dates"][:1]
    with pytest.raises(DatasetError, match=r"q-temporal.*equal length \(got 2, 1, 2\)"):
        load_longmemeval(_write(tmp_path, data))
    data = _questions()
    data[0]["haystack_dates"][1] = "yesterday-ish"
    with pytest.raises(DatasetError, match=r"haystack_dates\[1\].*yesterday-ish"):
        load_longmemeval(_write(tmp_path, data, "d.json"))


def test_unknown_ids_and_types(tmp_path):
    path = _write(tmp_path, _questions())
    with pytest.raises(DatasetError) as info:
        load_longmemeval(path, ["zzz"])
    assert "zzz" in str(info.value) and "q-pref" in str(info.value)
    with pytest.raises(DatasetError, match="abstention"):
        load_longmemeval(path, question_types=["abstention"])
    data = _questions()
    data[0]["question_type"] = "multi-hop"
    with pytest.raises(DatasetError, match="multi-hop"):
        load_longmemeval(_write(tmp_path, data, "t.json"))


# ------------------------------------------------------------------ judge routing


def _yes_if_contains(gold_field: str):
    def respond(i: dict[str, str]) -> str:
        return chat_reply(label="yes" if i[gold_field].split()[0].lower() in i["generated_answer"].lower() else "no")
    return respond


@pytest.fixture
def judge_lm():
    lm = LongMemEvalLM({
        "JudgeLongMemEvalDefault": _yes_if_contains("gold_answer"),
        "JudgeLongMemEvalTemporal": _yes_if_contains("gold_answer"),
        "JudgeLongMemEvalKnowledgeUpdate": _yes_if_contains("gold_answer"),
        "JudgeLongMemEvalPreference": lambda i: chat_reply(label="yes" if "hiking" in i["generated_answer"] else "no"),
        "JudgeLongMemEvalAbstention": lambda i: chat_reply(
            label="yes" if "not" in i["generated_answer"].lower() else "no"),
    })
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        yield lm


def test_signature_routing_table():
    assert judge_signature("single-session-user") is JudgeLongMemEvalDefault
    assert judge_signature("single-session-assistant") is JudgeLongMemEvalDefault
    assert judge_signature("multi-session") is JudgeLongMemEvalDefault
    assert judge_signature("temporal-reasoning") is JudgeLongMemEvalTemporal
    assert judge_signature("knowledge-update") is JudgeLongMemEvalKnowledgeUpdate
    assert judge_signature("single-session-preference") is JudgeLongMemEvalPreference
    for t in QUESTION_TYPES:
        assert judge_signature(t, is_abstention=True) is JudgeLongMemEvalAbstention
    with pytest.raises(InvalidInputError, match="question_type"):
        judge_signature("adversarial")


def test_judge_routes_loaded_questions(judge_lm, qs, caplog, ledger):
    with caplog.at_level(logging.INFO, logger="nemori_dspy.eval.longmemeval_judge"):
        judge = LongMemEvalJudge()
    assert judge.model == "openai/scripted"
    assert judge.prompt_hash == LONGMEMEVAL_JUDGE_PROMPT_HASH and len(judge.prompt_hash) == 12
    assert judge.prompt_hashes["JudgeLongMemEvalTemporal"] == signature_hash(JudgeLongMemEvalTemporal)
    assert LONGMEMEVAL_JUDGE_PROMPT_HASH in caplog.text and "openai/scripted" in caplog.text

    t, p, a = (question_example(q) for q in qs)
    assert judge(t, dspy.Prediction(answer="3 days")) == 1.0
    assert judge(p, dspy.Prediction(answer="Try hiking nearby.")) == 1.0
    assert judge(p, dspy.Prediction(answer="Watch a movie.")) == 0.0
    # abstention overrides knowledge-update
    assert judge(a, dspy.Prediction(answer="You did not mention a cat.")) == 1.0
    assert judge(a, dspy.Prediction(answer="Whiskers")) == 0.0

    names = [name for name, _ in judge_lm.prompts]
    assert names == ["JudgeLongMemEvalTemporal", "JudgeLongMemEvalPreference", "JudgeLongMemEvalPreference",
                     "JudgeLongMemEvalAbstention", "JudgeLongMemEvalAbstention"]
    assert judge.calls == {"JudgeLongMemEvalTemporal": 1, "JudgeLongMemEvalPreference": 2,
                           "JudgeLongMemEvalAbstention": 2}
    # the reference goes into the signature's own field (rubric / explanation / gold answer)
    assert judge_lm.prompts[0][1]["gold_answer"] == "3"
    assert "hiking" in judge_lm.prompts[1][1]["rubric"]
    assert "dog" in judge_lm.prompts[3][1]["explanation"]
    assert ledger.snapshot()["judge"].calls == 5  # charged to the "judge" stage


def test_judge_other_types_and_abstention_from_id(judge_lm):
    judge = LongMemEvalJudge()
    for qtype in ("single-session-user", "single-session-assistant", "multi-session"):
        ex = dspy.Example(question="Where?", answer="Paris", question_type=qtype, question_id=f"x-{qtype}")
        assert judge(ex, dspy.Prediction(answer="In Paris.")) == 1.0
    ku = dspy.Example(question="Where do I live now?", answer="Berlin", question_type="knowledge-update",
                      question_id="ku-1")
    assert judge(ku, dspy.Prediction(answer="You moved from Rome to Berlin.")) == 1.0
    # no is_abstention field: read from the id suffix
    ab = dspy.Example(question="Who?", answer="Never mentioned", question_type="multi-session", question_id="m_abs")
    assert judge(ab, dspy.Prediction(answer="That was not mentioned.")) == 1.0
    assert [n for n, _ in judge_lm.prompts] == ["JudgeLongMemEvalDefault"] * 3 + [
        "JudgeLongMemEvalKnowledgeUpdate", "JudgeLongMemEvalAbstention"]


def test_judge_failure_scores_zero(judge_lm):
    judge_lm.responders["JudgeLongMemEvalDefault"] = lambda i: "garbage without fields"
    judge = LongMemEvalJudge(parse_retries=0)
    ex = dspy.Example(question="Where?", answer="Paris", question_type="multi-session", question_id="x")
    assert judge(ex, dspy.Prediction(answer="Paris")) == 0.0
    assert judge.failures == 1


def test_judge_uses_its_own_lm(qs):
    lm = LongMemEvalLM({"JudgeLongMemEvalTemporal": lambda i: chat_reply(label="yes")})
    judge = LongMemEvalJudge(lm=lm)  # no dspy.settings.lm configured
    with dspy.context(adapter=dspy.ChatAdapter()):
        assert judge(question_example(qs[0]), dspy.Prediction(answer="whatever")) == 1.0
    assert lm.calls == {"JudgeLongMemEvalTemporal": 1}


def test_summarise_accuracy():
    rows = [("temporal-reasoning", False, 1.0), ("temporal-reasoning", True, 0.0),
            ("knowledge-update", False, 1.0), ("knowledge-update", False, 1.0)]
    s = summarise_accuracy(rows)
    assert s["overall"] == 0.75
    assert s["per_type"] == {"temporal-reasoning": 0.5, "knowledge-update": 1.0}
    assert s["task_averaged"] == 0.75 and s["abstention"] == 0.0
    assert s["counts"] == {"temporal-reasoning": 2, "knowledge-update": 2, "abstention": 1}
    assert summarise_accuracy([])["overall"] is None

