"""Result files written as a whole payload (``benchmarks/results/<name>.json``) with the machine they ran on.

The machine description itself is ``benchmarks.results_io.machine`` (one for every benchmark); the store
benchmarks add the numpy and SQLite versions their figures depend on.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np

from benchmarks.results_io import RESULTS_DIR, machine

__all__ = ["describe_machine", "write_result", "RESULTS_DIR"]


def describe_machine() -> dict:
    """``results_io.machine()`` (CPU, cores, memory GiB, 1-min load, OS, Python, commit, UTC time) plus the numpy
    and SQLite versions."""
    return {**machine(), "numpy": np.__version__, "sqlite": sqlite3.sqlite_version}


def write_result(name: str, payload: dict) -> Path:
    """Write ``payload`` as ``benchmarks/results/<name>.json`` (pretty, UTF-8); returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"wrote {path.relative_to(RESULTS_DIR.parent.parent)}")
    return path
