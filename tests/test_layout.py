"""Import hygiene of the checkout, read from the source (ast), not by importing it:

- a test imports shared helpers from ``tests.fakes`` only (fixtures come from ``tests/conftest.py``), never
  from another test module;
- the package and ``benchmarks/`` never import ``tests``;
- the folders mapped into ``nemori_dspy.*`` by setuptools ``package-dir`` (``eval/``, ``optimizers/``,
  ``signatures/``) import absolutely: on disk they sit at the repo root, so a relative ``..`` import there
  would point above the repo.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("eval", "optimizers", "signatures")


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, level) of every import in ``path``; ``level`` > 0 for relative imports."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or "", node.level))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, 0) for alias in node.names)
    return out


def _py(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def test_tests_import_only_the_shared_helpers():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in _py("tests") for line, mod, level in _imports(p)
           if (mod == "tests" or mod.startswith("tests.")) and mod != "tests.fakes"]
    assert bad == []


@pytest.mark.parametrize("folder", ["nemori_dspy", "benchmarks", *MAPPED])
def test_package_and_benchmarks_never_import_tests(folder):
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in _py(folder) for line, mod, level in _imports(p)
           if level == 0 and (mod == "tests" or mod.startswith("tests."))]
    assert bad == []


@pytest.mark.parametrize("folder", MAPPED)
def test_mapped_folders_import_absolutely(folder):
    bad = [f"{p.relative_to(ROOT)}:{line} ({'.' * level}{mod})" for p in _py(folder)
           for line, mod, level in _imports(p) if level > 0]
    assert bad == []


def _declared() -> dict[str, list[str]]:
    """``{normalised distribution name: [requirement strings]}`` from pyproject's dependencies and extras."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    out: dict[str, list[str]] = {}
    for r in reqs:
        name = re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0]
        out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), []).append(r)
    return out


#: modules imported directly that come with a declared distribution whose API they are part of.
_VIA = {"pydantic_core": "pydantic", "transformers": "sentence-transformers", "starlette": "fastapi",
        "anyio": "httpx", "tokenizers": "fastembed", "torch": "sentence-transformers"}


def test_every_third_party_import_is_declared_and_installed_versions_meet_the_floors():
    import re
    import sys
    from importlib.metadata import packages_distributions, version

    from packaging.requirements import Requirement

    declared = _declared()
    dists = packages_distributions()
    local = {"nemori_dspy", "eval", "optimizers", "signatures", "tests", "benchmarks", "__future__"}
    missing = set()
    for folder in ("nemori_dspy", *MAPPED):
        for path in (ROOT / folder).rglob("*.py"):
            for line, module, level in _imports(path):
                top = module.split(".")[0]
                if level or not top or top in local or top in sys.stdlib_module_names:
                    continue
                names = {re.sub(r"[-_.]+", "-", d).lower() for d in dists.get(top, [top])}
                if not names & set(declared) and top not in _VIA:
                    missing.add(f"{path.relative_to(ROOT)}:{line} {top}")
    assert not missing, f"imports not declared in pyproject.toml: {sorted(missing)}"
    for name, reqs in declared.items():
        if name == "nemori-dspy":
            continue
        for r in reqs:
            req = Requirement(r)
            assert req.specifier.contains(version(req.name), prereleases=True), \
                f"installed {req.name} {version(req.name)} does not meet {r}"
