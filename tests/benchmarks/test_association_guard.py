"""The association-guard measurement at toy size: continuation pairs from QA evidence, the sweep, the run."""

from __future__ import annotations

import json

import pytest

from benchmarks.association_guard import Conversation, continuations, conversations, main, suggest, sweep


def _turn(dia, who, text):
    return {"speaker": who, "dia_id": dia, "text": text}


def _sample() -> dict:
    """Three sessions in LoCoMo's schema; one question's evidence joins sessions 1 and 3."""
    conv = {"speaker_a": "Ann", "speaker_b": "Ben"}
    for n, text in ((1, "I adopted a cat named Tom."), (2, "My bakery opened today."), (3, "Tom the cat is sick.")):
        conv[f"session_{n}_date_time"] = f"1:00 pm on {n} May, 2023"
        conv[f"session_{n}"] = [_turn(f"D{n}:1", "Ann", text), _turn(f"D{n}:2", "Ben", "Oh!")]
    return {"sample_id": "toy", "conversation": conv,
            "session_summary": {f"session_{n}_summary": conv[f"session_{n}"][0]["text"] for n in (1, 2, 3)},
            "qa": [{"question": "What is wrong with Ann's cat?", "answer": "sick", "evidence": ["D1:1", "D3:1"],
                    "category": 1},
                   {"question": "adversarial", "evidence": ["D2:1", "D3:1"], "category": 5}]}


def test_continuations_are_session_pairs_one_scored_questions_evidence_joins():
    assert continuations(_sample()) == {(1, 3)}  # the category-5 item does not count


@pytest.mark.parametrize("unit, texts", [("summary", 1), ("window", 1)])
def test_each_session_becomes_texts_to_embed(unit, texts):
    conv = conversations([_sample()], unit, window=10)[0]
    assert sorted(conv.texts) == [1, 2, 3] and all(len(t) == texts for t in conv.texts.values())
    assert conv.pairs == {(1, 3)}


def test_sweep_counts_recall_leaks_and_later_sessions_left_without_a_candidate():
    conv = Conversation("toy", {1: ["a"], 2: ["b"], 3: ["c"]}, {(1, 3)})
    sims = {(1, 2): 0.3, (1, 3): 0.7, (2, 3): 0.5}
    low, high = sweep([conv], [sims], [0.4, 0.6])
    assert (low["recall"], low["unrelated_through"], low["no_candidate_share"]) == (1.0, 0.5, 0.5)
    assert (high["recall"], high["unrelated_through"], high["no_candidate_share"], high["precision"]) == \
        (1.0, 0.0, 0.5, 1.0)
    assert suggest([low, high], 0.8)["floor"] == 0.6


def test_runs_on_data_in_locomo_schema(tmp_path, capsys):
    data = tmp_path / "toy.json"
    data.write_text(json.dumps([_sample()]))
    figures = main(["--data", str(data), "--embedder", "hashing-64", "--out", str(tmp_path)])
    assert "suggested floor" in capsys.readouterr().out and "suggested_floor" in figures
    saved = json.loads((tmp_path / "association_guard-summary-hashing-64.json").read_text())
    assert saved["figures"]["rows"] and saved["machine"]


def test_auc_is_the_chance_a_continuation_scores_above_an_unrelated_pair():
    import numpy as np

    from benchmarks.association_guard import auc

    assert auc(np.array([0.9, 0.8]), np.array([0.1, 0.2])) == 1.0
    assert auc(np.array([0.5]), np.array([0.5])) == 0.5
    assert auc(np.array([0.3, 0.9]), np.array([0.5])) == 0.5
