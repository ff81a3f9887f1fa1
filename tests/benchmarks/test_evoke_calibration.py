"""benchmarks.evoke_calibration on hand-made episodes and facts: related pairs come from cross-episode evidence."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace

import numpy as np

from benchmarks.evoke_calibration import probes, suggest, sweep


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return list(v / np.linalg.norm(v))


def _ep(i, ids, vec):
    t = datetime(2023, 1, 1) + timedelta(days=i)
    return SimpleNamespace(id=f"e{i}", message_ids=ids, start=t, vector=_unit(vec))


def _fact(src, vec):
    return SimpleNamespace(source_episode_ids=[src], vector=_unit(vec))


def test_the_later_evidence_episode_should_evoke_the_facts_of_the_earlier_one():
    eps = [_ep(0, ["D1:1"], [1, 0, 0]), _ep(1, ["D2:1"], [0, 1, 0]), _ep(2, ["D3:1"], [0.8, 0.2, 0])]
    facts = [_fact("e0", [0.9, 0.1, 0]), _fact("e1", [0, 1, 0]), _fact("e2", [1, 0, 0])]  # e2's fact is later
    qs = [SimpleNamespace(evidence=["D1:1", "D3:1"])]
    (p,) = probes(eps, facts, qs)
    assert len(p.cosines) == 2 and p.related.tolist() == [True, False]  # the pool holds only earlier facts
    rows = {r["tau"]: r for r in sweep([p], taus=[0.5, 0.995])}
    assert rows[0.5]["fires"] == 1.0 and rows[0.5]["recall"] == 1.0 and rows[0.5]["precision"] == 1.0
    assert rows[0.995]["fires"] == 0.0
    assert suggest(list(rows.values())) == 0.5


def test_an_episode_with_no_earlier_fact_is_not_a_probe():
    eps = [_ep(0, ["D1:1"], [1, 0]), _ep(1, ["D2:1"], [0, 1])]
    assert probes(eps, [], [SimpleNamespace(evidence=["D1:1", "D2:1"])]) == []
