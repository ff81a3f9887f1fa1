"""LoCoMo loader tests: the shipped synthetic mini (tests/data/synthetic_mini.json), tiny synthetic files
written per test, and — marked ``real_data``, skipped where it is absent — LoCoMo's own locomo_mini.json."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from nemori_dspy.errors import DatasetError
from nemori_dspy.eval.locomo import (
    CATEGORY_NAMES,
    SCORED_CATEGORIES,
    dataset_sha256,
    load_locomo,
)
from tests.fakes import DATA_DIR, SYNTHETIC_MINI

MINI_SHA256 = "fae07ca3ea7857269e6d78d57703ed2c9d8dc62fb1fe162432af04c6d9343b25"


# ------------------------------------------------------------------ the shipped synthetic mini (always runs)

@pytest.fixture
def synth(synthetic_mini):
    (conv,) = synthetic_mini
    return conv


def test_synthetic_mini_is_what_its_script_writes(tmp_path):
    """The committed JSON is reproducible: make_synthetic.py writes it byte for byte."""
    out = tmp_path / "regenerated.json"
    subprocess.run([sys.executable, str(DATA_DIR / "make_synthetic.py"), str(out)], check=True, capture_output=True)
    assert out.read_bytes() == SYNTHETIC_MINI.read_bytes()


def test_synthetic_mini_messages(synth):
    assert synth.sample_id == "synth-1"
    assert (synth.speaker_a, synth.speaker_b) == ("Noor", "Elias")
    assert len(synth.messages) == 56  # 19 + 17 + 20 turns
    assert (synth.messages[0].id, synth.messages[19].id, synth.messages[-1].id) == ("D1:1", "D2:1", "D3:20")
    assert sorted({m.timestamp.date() for m in synth.messages}) == [date(2023, 4, 3), date(2023, 4, 21),
                                                                    date(2023, 5, 12)]
    # "10:15 am on 3 April, 2023" for the whole first session, "7:40 pm on 21 April, 2023" for the second
    assert {(m.timestamp.hour, m.timestamp.minute) for m in synth.messages[:19]} == {(10, 15)}
    assert (synth.messages[19].timestamp.hour, synth.messages[19].timestamp.minute) == (19, 40)
    assert {m.speaker for m in synth.messages} == {"Noor", "Elias"}


def test_synthetic_mini_image_turns(synth):
    images = [m.id for m in synth.messages if "[shares an image:" in m.content]
    assert images == ["D1:7", "D1:17", "D2:5", "D3:5", "D3:11"]
    d25 = next(m for m in synth.messages if m.id == "D2:5")
    assert d25.content == ("She sleeps most of the day and steals socks at night. "
                           "[shares an image: a photo of a grey dog lying on a couch next to a sock]")


def test_synthetic_mini_questions(synth):
    qs = synth.questions
    assert len(qs) == 25 and [q.index for q in qs] == list(range(25))
    assert [sum(q.category == c for q in qs) for c in (1, 2, 3, 4, 5)] == [4, 7, 2, 7, 5]
    assert sum(q.category in SCORED_CATEGORIES for q in qs) == 20
    assert (qs[2].answer, qs[2].category) == ("2019", 2) and (qs[3].answer, qs[3].category) == ("4", 4)  # ints
    cat5 = [q for q in qs if q.category == 5]
    assert all(q.answer == "" for q in cat5)
    ids = {m.id for m in synth.messages}
    assert all(q.evidence and set(q.evidence) <= ids for q in qs)  # every item points at real turns
    assert {q.sample_id for q in qs} == {"synth-1"}


def test_synthetic_mini_malformed_evidence(synth):
    by_raw = {tuple(q.raw_evidence): q.evidence for q in synth.questions}
    assert by_raw[("D1:13 D1:14",)] == ["D1:13", "D1:14"]  # space-joined
    assert by_raw[("D2:08",)] == ["D2:8"]  # leading zero
    assert by_raw[("D3:10; D3:11",)] == ["D3:10", "D3:11"]  # ';'-joined
    assert by_raw[("D1:3; D2:12", "D3:11", "D")] == ["D1:3", "D2:12", "D3:11"]  # "D" dropped
    assert by_raw[("D1:9", "D:1:9")] == ["D1:9"]  # "D:1:9" dropped


def test_synthetic_mini_sample_filter():
    assert [c.sample_id for c in load_locomo(SYNTHETIC_MINI, ["synth-1"])] == ["synth-1"]
    with pytest.raises(DatasetError, match="synth-1"):
        load_locomo(SYNTHETIC_MINI, ["conv-99"])


# ------------------------------------------------------------------ the real locomo_mini.json (opt-in, real data)

@pytest.fixture
def real_mini(real_locomo_mini_path):
    convs = load_locomo(real_locomo_mini_path)
    assert len(convs) == 1
    return convs[0]


@pytest.mark.real_data
def test_real_locomo_mini_messages(real_mini):
    mini = real_mini
    assert mini.sample_id == "conv-26"
    assert (mini.speaker_a, mini.speaker_b) == ("Caroline", "Melanie")
    assert len(mini.messages) == 58  # 18 + 17 + 23 turns
    assert mini.messages[0].id == "D1:1"
    assert mini.messages[-1].id == "D3:23"
    dates = sorted({m.timestamp.date() for m in mini.messages})
    assert dates == [date(2023, 5, 8), date(2023, 5, 25), date(2023, 6, 9)]
    # "1:56 pm on 8 May, 2023" → 13:56 for the whole first session
    assert mini.messages[0].timestamp.hour == 13 and mini.messages[0].timestamp.minute == 56
    assert {m.speaker for m in mini.messages} == {"Caroline", "Melanie"}


@pytest.mark.real_data
def test_real_locomo_mini_image_turns(real_mini):
    images = [m for m in real_mini.messages if "[shares an image:" in m.content]
    assert len(images) == 7
    d15 = next(m for m in real_mini.messages if m.id == "D1:5")
    assert d15.content.endswith(
        "[shares an image: a photo of a dog walking past a wall with a painting of a woman]"
    )


@pytest.mark.real_data
def test_real_locomo_mini_questions(real_mini):
    qs = real_mini.questions
    assert len(qs) == 25
    assert [q.index for q in qs] == list(range(25))
    assert sum(q.category in SCORED_CATEGORIES for q in qs) == 20
    assert qs[1].answer == "2022" and qs[1].category == 2  # int answer in the file
    cat5 = [q for q in qs if q.category == 5]
    assert len(cat5) == 5 and all(q.answer == "" for q in cat5)
    assert all(q.evidence for q in qs)
    assert qs[0].sample_id == "conv-26"


@pytest.mark.real_data
def test_real_locomo_mini_sample_filter_and_sha(real_locomo_mini_path):
    path = real_locomo_mini_path
    assert [c.sample_id for c in load_locomo(path, ["conv-26"])] == ["conv-26"]
    with pytest.raises(DatasetError, match="conv-26"):
        load_locomo(path, ["conv-99"])
    assert dataset_sha256(path) == MINI_SHA256


def test_constants():
    assert CATEGORY_NAMES[1] == "multi-hop" and CATEGORY_NAMES[4] == "single-hop"
    assert SCORED_CATEGORIES == (1, 2, 3, 4)


# ------------------------------------------------------------------ tiny files written per test

def _sample(sample_id: str = "s-1", **overrides) -> dict:
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_10_date_time": "9:00 am on 3 June, 2023",
        "session_10": [{"speaker": "Bob", "dia_id": "D10:1", "text": "Later."}],
        "session_2_date_time": "10:05 pm on 1 May, 2023",
        "session_2": [
            {"speaker": "Ann", "dia_id": "D2:1", "text": "Hi Bob!"},
            {"speaker": "Bob", "dia_id": "D2:2", "text": "Look.", "blip_caption": "a photo of a cat"},
        ],
        "session_11_date_time": "9:00 am on 4 June, 2023",  # date key without turns
    }
    qa = [
        {"question": "q0", "answer": " 23 July, 2023", "evidence": ["D8:6; D9:17", "D", "D:11:26"],
         "category": 2},
        {"question": "q1", "answer": 3, "evidence": ["D30:05", "D9:1 D4:4 D4:6"], "category": 1},
        {"question": "q2", "adversarial_answer": "yes", "evidence": [], "category": 5},
    ]
    sample = {"sample_id": sample_id, "conversation": conv, "qa": qa}
    sample.update(overrides)
    return sample


def _write(tmp_path: Path, data, name: str = "loco.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_synthetic_sessions_sorted_numerically(tmp_path):
    (conv,) = load_locomo(_write(tmp_path, [_sample()]))
    # session_2 before session_10 (numeric, not lexicographic); date-only key ignored
    assert [m.id for m in conv.messages] == ["D2:1", "D2:2", "D10:1"]
    assert conv.messages[0].timestamp.isoformat() == "2023-05-01T22:05:00"
    assert conv.messages[2].timestamp.isoformat() == "2023-06-03T09:00:00"
    assert conv.messages[1].content == "Look. [shares an image: a photo of a cat]"
    assert conv.messages[0].content == "Hi Bob!"


def test_synthetic_evidence_normalisation(tmp_path):
    (conv,) = load_locomo(_write(tmp_path, [_sample()]))
    q0, q1, q2 = conv.questions
    assert q0.evidence == ["D8:6", "D9:17"]  # split on ';', "D" and "D:11:26" dropped
    assert q0.raw_evidence == ["D8:6; D9:17", "D", "D:11:26"]
    assert q1.evidence == ["D30:5", "D9:1", "D4:4", "D4:6"]  # leading zero, whitespace split
    assert q2.evidence == [] and q2.answer == "" and q2.adversarial_answer == "yes"
    assert q0.adversarial_answer is None  # only items that carry one
    assert q0.answer == "23 July, 2023"  # stripped
    assert q1.answer == "3"  # int → str


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(DatasetError, match="nope.json"):
        load_locomo(missing)
    with pytest.raises(DatasetError, match="not found"):
        dataset_sha256(missing)


def test_bad_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_locomo(path)


def test_sample_missing_keys(tmp_path):
    bad = _sample()
    del bad["qa"]
    with pytest.raises(DatasetError, match="'qa'"):
        load_locomo(_write(tmp_path, [bad]))
    bad = _sample()
    del bad["conversation"]
    with pytest.raises(DatasetError, match="'conversation'"):
        load_locomo(_write(tmp_path, [bad], "b.json"))


def test_unknown_sample_id_lists_available(tmp_path):
    path = _write(tmp_path, [_sample("a-1"), _sample("b-2")])
    with pytest.raises(DatasetError) as info:
        load_locomo(path, ["zzz"])
    assert "a-1" in str(info.value) and "b-2" in str(info.value)
    assert [c.sample_id for c in load_locomo(path, ["b-2", "a-1"])] == ["b-2", "a-1"]
