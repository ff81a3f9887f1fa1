"""The docs site builds strictly (broken links, anchors or a failing generator hook fail it), and the README
stays a quickstart that keeps the two commands CI and new users rely on."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAIN_JOB = (".ci/setup && .venv/bin/nemori-dspy eval locomo --data ../shared/data/locomo/locomo_mini.json "
            "--judge-model local:1.5b")
TESTS = ".ci/setup && .venv/bin/python -m pytest"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs / mkdocs-material not installed (pip install -e '.[docs]')")
def test_docs_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = {p.parent.name for p in (tmp_path / "site").rglob("index.html")}
    assert {"configuration", "evaluation", "tuning", "serving", "architecture", "benchmarks", "measurements",
            "decisions"} <= pages
    # the generated tables made it into the pages
    from nemori_dspy.config import NemoriSettings

    config_html = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert all(f"NEMORI_{name.upper()}" in config_html for name in NemoriSettings.model_fields)
    results_html = (tmp_path / "site" / "measurements" / "index.html").read_text(encoding="utf-8")
    assert all(p.name in results_html for p in (ROOT / "benchmarks" / "results").iterdir()
               if p.suffix in (".json", ".md"))


def test_readme_is_a_quickstart_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert MAIN_JOB in text
    assert TESTS in text
    assert len(text.splitlines()) <= 250


def test_readme_links_point_at_existing_docs_pages():
    import re

    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8"))
    assert links and all((ROOT / link).is_file() for link in links)
