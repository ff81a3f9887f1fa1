"""The HTTP load test script runs small and reports 0 lost, 0 duplicated, 0 cross-user reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_small_load_run_loses_nothing_and_leaks_nothing():
    out = subprocess.run([sys.executable, "-m", "benchmarks.serve_load", "--clients", "4", "--users", "3",
                          "--rounds", "3", "--window", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "lost 0, duplicated 0, cross-user reads 0" in out.stdout and "requests/s" in out.stdout
