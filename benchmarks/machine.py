"""Machine description written beside every benchmark result (so a figure names the machine it ran on)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["machine_description"]

_PACKAGES = ("dspy", "litellm", "llama_cpp_python", "sentence-transformers", "numpy")


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    """HEAD of the checkout this file is in (None outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine_description() -> dict[str, Any]:
    """``{"platform", "cpu", "cores", "python", "packages": {name: version}, "commit"}`` of this machine and checkout."""
    return {"platform": platform.platform(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "python": sys.version.split()[0], "packages": _versions(), "commit": _git_commit()}
