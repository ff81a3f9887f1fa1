"""What every speed and cost benchmark shares: the machine description, the table with the target beside each
figure, and the JSON result file in ``benchmarks/results/``.

Figures are printed for people and written to JSON for later comparison; nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["RESULTS_DIR", "machine", "table", "write_result", "percentile_ms", "cli_description"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        return round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return None


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model, cores, memory (GiB), 1-min load average at the end (other
    work on a shared machine shows here), OS, Python, commit, UTC time."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(), "load_avg_1min": load,
            "os": platform.platform(), "python": sys.version.split()[0], "commit": _git_commit(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (``header`` then ``rows``; cells are printed with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_result(name: str, params: dict[str, Any], figures: dict[str, Any], out_dir: Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` (default ``benchmarks/results/``): params, figures and :func:`machine`.

    Returns the path written."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "params": params, "figures": figures, "machine": machine()},
                               indent=1, default=str) + "\n")
    return path


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100, numpy's linear interpolation) of durations in seconds, in milliseconds."""
    import numpy as np

    return float(np.percentile(np.asarray(seconds, dtype=float), q)) * 1000 if len(seconds) else float("nan")


def cli_description(doc: str | None) -> str:
    """A benchmark's ``--help`` description: the first paragraph of its module docstring ``doc`` on one line (a first
    line alone may stop mid-sentence); "" for no docstring."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())
