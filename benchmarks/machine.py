"""The machine a benchmark ran on, and where its result file goes (``benchmarks/results/<name>.json``)."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

__all__ = ["describe_machine", "write_result", "RESULTS_DIR"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def describe_machine() -> dict:
    """CPU model, logical cores, RAM (GB), OS, Python/numpy/SQLite versions, 1-min load, UTC time, git commit."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "ram_gb": _mem_gb(), "os": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "sqlite": sqlite3.sqlite_version,
            "load_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": _commit()}


def write_result(name: str, payload: dict) -> Path:
    """Write ``payload`` as ``benchmarks/results/<name>.json`` (pretty, UTF-8); returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"wrote {path.relative_to(RESULTS_DIR.parent.parent)}")
    return path
