"""The τ measurement runs at toy size (synthetic LoCoMo-schema data, hashing embedder) and sweeps correctly."""

from __future__ import annotations

import json
import numpy as np

from benchmarks.evoke_threshold import Probe, main, sweep



def _sample() -> dict:
    """Two sessions in LoCoMo's schema; one question whose evidence spans both, observations on its turns."""
    turn = lambda d, who, text: {"speaker": who, "dia_id": d, "text": text}  # noqa: E731
    return {"sample_id": "toy", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1:00 pm on 1 May, 2023",
        "session_1": [turn("D1:1", "Ann", "I adopted a cat named Tom."), turn("D1:2", "Ben", "Lovely!")],
        "session_2_date_time": "1:00 pm on 9 May, 2023",
        "session_2": [turn("D2:1", "Ann", "Tom the cat is sick."), turn("D2:2", "Ben", "Oh no.")]},
        "observation": {"session_1_observation": {"Ann": [["Ann adopted a cat named Tom.", "D1:1"]],
                                                  "Ben": [["Ben is kind.", "D1:2"]]},
                        "session_2_observation": {"Ann": [["Tom is sick.", "D2:1"]]}},
        "qa": [{"question": "What is wrong with Ann's cat?", "answer": "sick", "evidence": ["D1:1", "D2:1"],
                "category": 1}]}


def test_sweep_counts_recall_evoked_and_empty():
    probes = [Probe("e1", positives=[0], pool=[0, 1]), Probe("e2", positives=[2], pool=[2, 3])]
    sims = [np.array([0.8, 0.3]), np.array([0.2, 0.1])]
    low, high = sweep(sims, probes, [0.25, 0.5])
    assert (low["recall"], low["mean_evoked"], low["empty_share"]) == (0.5, 1.0, 0.5)
    assert (high["recall"], high["mean_evoked"], high["empty_share"]) == (0.5, 0.5, 0.5)


def test_runs_on_data_in_locomo_schema(tmp_path, capsys):
    data = tmp_path / "toy.json"
    data.write_text(json.dumps([_sample()]))
    result = main(["--data", str(data), "--embedder", "hashing-64", "--out", str(tmp_path)])
    assert (result["probes"], result["facts"]) == (1, 3) and "suggested τ" in capsys.readouterr().out
    saved = json.loads((tmp_path / "evoke_threshold-hashing-64.json").read_text())
    assert saved["suggested_tau"] == result["suggested_tau"] and "machine" in saved
