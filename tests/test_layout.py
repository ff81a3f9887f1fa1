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


# ---------------------------------------------------------------- layers
#
# core (``nemori_dspy`` but its applications, with ``signatures/`` as ``nemori_dspy.signatures``) <- ``eval``
# <- ``optimizers`` (which may import eval; eval never imports optimizers) <- applications; ``benchmarks`` may
# import any of them. No module imports another module's private (``_``-prefixed) name, ours or a library's.

#: folder on disk → the package it is installed as (``pyproject.toml`` ``package-dir``).
INSTALLED_AS = {"nemori_dspy": "nemori_dspy", "eval": "nemori_dspy.eval", "optimizers": "nemori_dspy.optimizers",
                "signatures": "nemori_dspy.signatures", "benchmarks": "benchmarks"}
CORE, EVAL, OPTIMIZERS, APPS, BENCHMARKS = range(5)
LAYER_NAMES = ("core", "eval", "optimizers", "applications", "benchmarks")
def _module_name(path: Path) -> str:
    """The dotted name ``path`` (repo-relative) is imported as once installed."""
    parts = list(path.with_suffix("").parts)
    name = [*INSTALLED_AS[parts[0]].split("."), *parts[1:]]
    return ".".join(name[:-1] if name[-1] == "__init__" else name)


def _installed(module: str) -> str:
    """A module name as installed: the mapped folders' bare names (``eval.runner``) under ``nemori_dspy``."""
    top = module.split(".")[0]
    return f"nemori_dspy.{module}" if top in ("eval", "optimizers", "signatures") else module


def layer_of(module: str) -> int | None:
    """The layer of a first-party module (``CORE`` ... ``BENCHMARKS``); None for a third-party or stdlib one."""
    if module == "benchmarks" or module.startswith("benchmarks."):
        return BENCHMARKS
    if not (module == "nemori_dspy" or module.startswith("nemori_dspy.")):
        return None
    if module == "nemori_dspy.apps" or module.startswith("nemori_dspy.apps."):
        return APPS
    if module.startswith("nemori_dspy.optimizers"):
        return OPTIMIZERS
    if module.startswith("nemori_dspy.eval"):
        return EVAL
    return CORE


def _imported(tree: ast.AST, me: str, is_package: bool, known: set[str]) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) of every import in ``tree`` (module- and function-level),
    relative ones resolved against ``me``; ``from pkg import submodule`` counts as importing the submodule."""
    package = me if is_package else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, _installed(a.name), None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = _installed(node.module or "")
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.append((node.lineno, sub, None) if sub in known else (node.lineno, module, a.name))
    return out


def layer_violations(source: str, rel_path: str, known: set[str]) -> list[str]:
    """Imports of ``source`` (the file at repo-relative ``rel_path``) against the layer order, and imports of a
    private name from another module (first- or third-party), as ``"<path>:<line> <what>"`` strings."""
    me = _module_name(Path(rel_path))
    mine = layer_of(me)
    bad = []
    for line, module, name in _imported(ast.parse(source, filename=rel_path), me, rel_path.endswith("__init__.py"),
                                        known):
        target = layer_of(module)
        if target is not None and target > mine and mine != BENCHMARKS:
            bad.append(f"{rel_path}:{line} {LAYER_NAMES[mine]} imports {LAYER_NAMES[target]} ({module})")
        private = [p for p in [*module.split(".")[1:], name or ""] if p.startswith("_") and not p.startswith("__")]
        if private and module != me:
            bad.append(f"{rel_path}:{line} imports private {private[-1]} from {module}")
    return bad


def _first_party() -> list[Path]:
    return [p for f in INSTALLED_AS for p in _py(f)]


def _known_modules() -> set[str]:
    return {_module_name(p.relative_to(ROOT)) for p in _first_party()}


def test_imports_follow_the_layers_and_take_no_private_names():
    known = _known_modules()
    bad = [v for p in _first_party() for v in layer_violations(p.read_text(encoding="utf-8"),
                                                               str(p.relative_to(ROOT)), known)]
    assert bad == []


@pytest.mark.parametrize("rel_path, source, what", [
    ("eval/model.py", "from nemori_dspy.optimizers.programs import PIPELINE_PATHS", "eval imports optimizers"),
    ("eval/model.py", "def f():\n    from optimizers import tune", "eval imports optimizers"),
    ("nemori_dspy/memory.py", "from .eval import runner", "core imports eval"),
    ("nemori_dspy/modules/flat.py", "from ..apps.cli import main", "core imports applications"),
    ("signatures/semantic.py", "import nemori_dspy.apps.serving.http", "core imports applications"),
    ("optimizers/tune.py", "from nemori_dspy.apps.cli import main", "optimizers imports applications"),
    ("eval/charts.py", "from nemori_dspy.eval.metrics import _usage", "private _usage"),
    ("benchmarks/ablation.py", "from nemori_dspy.apps.context import _other", "private _other"),
    ("nemori_dspy/adapters.py", "from dspy.adapters.json_adapter import _get_structured_outputs",
     "private _get_structured_outputs"),
])
def test_the_layer_check_catches_a_wrong_arrow_or_a_private_name(rel_path, source, what):
    known = _known_modules()
    found = layer_violations(source, rel_path, known)
    assert len(found) == 1 and what in found[0]


@pytest.mark.parametrize("rel_path, source", [
    ("optimizers/tune.py", "from nemori_dspy.eval.metrics import mean_ci95"),
    ("nemori_dspy/apps/cli/optimize.py", "from nemori_dspy.optimizers import tune"),
    ("benchmarks/ablation.py", "from nemori_dspy.optimizers.tune import run_optimize"),
    ("eval/runner.py", "from nemori_dspy.stages import CONSTRUCTION_STAGES as _STAGES"),
    ("nemori_dspy/modules/pipeline.py", "from ..signatures import SIGNATURES"),
])
def test_the_layer_check_allows_the_arrows_of_the_order(rel_path, source):
    assert layer_violations(source, rel_path, _known_modules()) == []


def test_the_license_file_is_the_license_pyproject_declares():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert declared == "Apache-2.0" and "Apache License" in text and "Version 2.0, January 2004" in text
