"""Issue 4: a scripted LM failing ~20% of calls in mixed ways loses and duplicates no message."""

from __future__ import annotations

import pytest

from benchmarks.fault_injection import run
from tests.fakes import SYNTHETIC_MINI


@pytest.mark.parametrize("seed", [1, 7])
def test_twenty_percent_faults_lose_nothing(seed):
    r = run(SYNTHETIC_MINI, rate=0.2, seed=seed)
    assert r["failed_calls"] > 0 and r["retries"] > 0
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["turns"] == r["in_one_episode"] == 56
    assert r["pending"] == 0 and r["to_distill"] == 0
