"""The consolidation floor: the committed labelled pairs, the sweep, and the default against MiniLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.consolidation_floor import (DEFAULT_PAIRS, KINDS, Pair, cosines, load_pairs, main, pair_speakers,
                                           suggest, sweep, topic_cosines)
from nemori_dspy.config import CONSOLIDATION_MIN_SIMILARITY, NemoriSettings
from nemori_dspy.embedders import find_minilm_dir


def test_the_committed_pairs_are_labelled_consistently_and_cover_every_kind():
    pairs = load_pairs(DEFAULT_PAIRS)
    counts = {k: sum(p.kind == k for p in pairs) for k in KINDS}
    assert len(pairs) >= 40 and min(counts.values()) >= 10
    assert len({(p.existing, p.insight) for p in pairs}) == len(pairs)


def test_a_label_that_contradicts_its_kind_is_refused(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text(json.dumps({"existing": "a", "insight": "b", "should_reach_p_con": True,
                               "kind": "different_person"}) + "\n")
    with pytest.raises(ValueError, match="different_person"):
        load_pairs(bad)


def test_sweep_counts_what_reaches_p_con_per_kind_and_suggests_the_highest_floor_keeping_every_update():
    pairs = [Pair("a", "b", True, "update"), Pair("c", "d", True, "update"), Pair("e", "f", False, "same_template")]
    rows = sweep(pairs, np.array([0.9, 0.55, 0.5]), [0.5, 0.55, 0.6])
    assert [r["reach"]["update"] for r in rows] == [2, 2, 1] and [r["leaked"] for r in rows] == [1, 0, 0]
    assert suggest(rows, 2)["floor"] == 0.55


def test_runs_with_the_hashing_embedder(tmp_path, capsys):
    figures = main(["--embedder", "hashing-64", "--out", str(tmp_path)])
    assert "suggested consolidation_min_similarity" in capsys.readouterr().out and len(figures["pairs"]) == len(load_pairs(DEFAULT_PAIRS))
    assert json.loads((tmp_path / "consolidation_floor-hashing-64.json").read_text())["machine"]


needs_minilm = pytest.mark.skipif(find_minilm_dir() is None, reason="all-MiniLM-L6-v2 is not on this machine")


def _minilm_pairs():
    """(the committed pairs, the default embedder, each pair's plain cosine)."""
    from nemori_dspy.embedders import resolve_embedder

    pairs = load_pairs(DEFAULT_PAIRS)
    embedder = resolve_embedder(NemoriSettings())
    return pairs, embedder, cosines(pairs, embedder.embed)


@needs_minilm
def test_at_the_default_floor_every_update_reaches_p_con_and_15_of_36_negatives_leak():
    """MiniLM's cosine is dominated by the person's name: 9 of the 15 leaks are the same person on another topic."""
    pairs, _, plain = _minilm_pairs()
    row = sweep(pairs, plain, [CONSOLIDATION_MIN_SIMILARITY])[0]
    assert NemoriSettings().consolidation_min_similarity == CONSOLIDATION_MIN_SIMILARITY
    assert row["reach"]["update"] == sum(p.kind == "update" for p in pairs)
    assert row["reach"]["refinement"] == sum(p.kind == "refinement" for p in pairs)
    assert (row["leaked"], row["negatives"]) == (15, 36)


def test_a_pairs_speakers_are_the_names_its_sentences_open_with():
    assert pair_speakers(Pair("Dev's favourite band is Radiohead.", "Carla listens to jazz.", False,
                              "different_person")) == {"dev", "carla"}
    assert pair_speakers(Pair("The concert is on Saturday.", "The concert was cancelled.", True, "update")) == set()


def test_the_topic_path_stops_a_pair_at_the_plain_floor_or_the_same_person_guard_and_masks_names_after():
    seen = []

    def embed(texts):  # one fixed unit vector per text; records what was embedded
        seen.extend(texts)
        return [np.eye(4)[len(t) % 4] for t in texts]

    pairs = [Pair("Keiko has a dog.", "Arjun has a cat.", False, "different_person"),
             Pair("Noor wants to study medicine.", "Noor became an architect.", True, "update"),
             Pair("Tomas lives in Lisbon.", "Tomas moved to Porto.", True, "update")]
    out = topic_cosines(pairs, embed, np.array([0.9, 0.9, 0.1]), 0.4)
    assert out[0] == -1 and out[2] == -1  # other person; below the plain floor
    assert seen == ["someone wants to study medicine.", "someone became an architect."]


def test_topic_mode_writes_its_own_result_file(tmp_path, capsys):
    main(["--embedder", "hashing-64", "--out", str(tmp_path), "--topic"])
    assert "suggested consolidation_topic_floor" in capsys.readouterr().out
    assert (tmp_path / "consolidation_floor-hashing-64-topic.json").exists()


@needs_minilm
def test_at_the_default_topic_floor_27_of_28_updates_reach_p_con_and_no_negative_leaks():
    """The cost of the topic floor: "Noor wants to study medicine" → "… an architect instead" (masked 0.19)."""
    from nemori_dspy.config import CONSOLIDATION_TOPIC_FLOOR

    pairs, embedder, plain = _minilm_pairs()
    sims = topic_cosines(pairs, embedder.embed, plain, CONSOLIDATION_MIN_SIMILARITY)
    row = sweep(pairs, sims, [CONSOLIDATION_TOPIC_FLOOR])[0]
    assert NemoriSettings().consolidation_topic_floor == CONSOLIDATION_TOPIC_FLOOR
    assert (row["reach"]["update"], row["reach"]["refinement"], row["leaked"]) == (27, 12, 0)
