"""The core install serves memory without the eval / optimize / local-model extras, and a command of a missing
extra fails with one clear error naming it (``MissingExtraError``: ``pip install "nemori-dspy[eval]"``).

A subprocess blocks the extras' packages with a meta-path finder (``nltk``, ``optuna``, ``huggingface_hub``
everywhere; ``tqdm`` only when a nemori-dspy module asks for it, since dspy, a core dependency, imports it
itself), then imports the core and the serving app, uses a memory, and runs the eval, optimize and
local-model entry points.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemori_dspy.errors import ConfigError, MissingExtraError
from nemori_dspy.extras import EXTRA_OF, extra_error, require

ROOT = Path(__file__).resolve().parents[1]

_BLOCKED = r'''
import importlib.abc, json, sys

BLOCK_ALL = {"nltk", "optuna", "huggingface_hub"}
FROM_OURS = {"tqdm"}


def _importer():
    f = sys._getframe(2)
    while f is not None and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
        f = f.f_back
    return f.f_globals.get("__name__", "") if f is not None else ""


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in BLOCK_ALL or (top in FROM_OURS and _importer().startswith("nemori_dspy")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, Block())
out = {}

import nemori_dspy
from nemori_dspy import Memory
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.store.sqlite import SQLiteStore
import nemori_dspy.apps.serving.http, nemori_dspy.apps.serving.mcp, nemori_dspy.apps.serving.worker
import nemori_dspy.apps.cli

mem = Memory(SQLiteStore(sys.argv[1]), HashingEmbedder(32), NemoriSettings(window_size=4, cache=False))
added = mem.add_messages("alice", [{"speaker": "alice", "content": f"I like tea {i}",
                                    "timestamp": f"2024-01-0{i + 1}T10:00:00"} for i in range(3)], process=False)
out["accepted"] = added.accepted
out["listed"] = len(mem.store.pending_messages("alice"))
out["loaded"] = sorted(m for m in BLOCK_ALL if m in sys.modules)  # tqdm: dspy imports it

import contextlib, io
err = io.StringIO()
with contextlib.redirect_stderr(err):
    out["eval_code"] = nemori_dspy.apps.cli.main(["eval", "locomo", "--data", sys.argv[1] + ".missing.json"])
out["eval_stderr"] = err.getvalue()

err = io.StringIO()
with contextlib.redirect_stderr(err):
    out["optimize_code"] = nemori_dspy.apps.cli.main(["optimize", "--stage", "narrate", "--optimizer", "mipro"])
out["optimize"] = err.getvalue()

from nemori_dspy.errors import MissingExtraError

from nemori_dspy.local_server import resolve_gguf
try:
    resolve_gguf(NemoriSettings(gguf="hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/model.gguf"))
except MissingExtraError as exc:
    out["local"] = str(exc)
print(json.dumps(out))
'''


def test_the_core_imports_and_serves_without_the_extras_and_their_commands_name_the_extra(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _BLOCKED, str(tmp_path / "m.sqlite")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["accepted"] == 3 and out["listed"] == 3
    assert out["loaded"] == []
    assert out["eval_code"] == 2
    assert 'error: nemori-dspy eval locomo needs \'nltk\'' in out["eval_stderr"]
    assert 'Fix: pip install "nemori-dspy[eval]"' in out["eval_stderr"]
    assert out["optimize_code"] == 2 and "error: nemori-dspy optimize needs" in out["optimize"]
    assert 'Fix: pip install "nemori-dspy[optimize]"' in out["optimize"]
    assert 'pip install "nemori-dspy[local]"' in out["local"] and "huggingface_hub" in out["local"]


#: the packages only an extra installs; no core or serving module may import them (eval/ and optimizers/ may,
#: as may the CLI commands of those extras, which import them inside the command).
_EXTRA_ONLY = {"nltk", "optuna", "tqdm", "huggingface_hub", "mlflow", "pandas", "matplotlib"}


def test_no_core_module_imports_an_extra_only_package():
    bad = []
    for path in sorted((ROOT / "nemori_dspy").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("nemori_dspy/apps/cli/evaluate.py", "nemori_dspy/apps/cli/optimize.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] in _EXTRA_ONLY]
    assert bad == []


def test_the_extras_named_exist_in_pyproject_and_all_holds_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_OF.values()) <= set(extras)
    everything = extras["all"][0].split("[", 1)[1].rstrip("]").split(",")
    assert set(everything) == set(extras) - {"all"}
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [r for r in core if r.split(">")[0].split("[")[0].replace("-", "_") in _EXTRA_ONLY]


def test_missing_extra_error_is_a_config_and_import_error_naming_the_command():
    exc = MissingExtraError("eval", "nltk", "nemori-dspy eval locomo")
    assert isinstance(exc, ConfigError) and isinstance(exc, ImportError)
    assert str(exc).endswith('Fix: pip install "nemori-dspy[eval]" (from a source checkout: pip install -e ".[eval]")')
    assert exc.command == 'pip install "nemori-dspy[eval]"' and exc.checkout_command == 'pip install -e ".[eval]"'
    assert extra_error(ModuleNotFoundError("x", name="nltk.stem")).extra == "eval"
    assert extra_error(ModuleNotFoundError("x", name="nltk"), extra="optimize").extra == "optimize"
    assert extra_error(ModuleNotFoundError("x", name="weaviate"), extra="eval").extra == "weaviate"
    assert extra_error(ModuleNotFoundError("x", name="not_an_extra_module")) is None
    with pytest.raises(ModuleNotFoundError) as info:
        require("not_an_extra_module_zz")
    assert not isinstance(info.value, MissingExtraError)
    assert require("json").dumps([]) == "[]"
