"""Optional extras: which ``pip install "nemori-dspy[<extra>]"`` provides which module, and the clear error
when one is missing.

The core install (``pip install nemori-dspy``) stores, searches and serves memory; evaluation (``nltk``,
``tqdm``, MLflow), optimisation (``optuna``), the local models (``huggingface_hub``, llama.cpp, the embedders)
and the servers (FastAPI, MCP) are extras (``pyproject.toml``). Code that needs one calls ``require``; the
command line turns a ``ModuleNotFoundError`` of an extra's module into ``MissingExtraError``
(``extra_error``), so the message names the command to run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

__all__ = ["EXTRA_OF", "INCLUDES", "COMMAND_EXTRA", "require", "extra_error"]

#: top-level module → the extra that installs it (the smallest one; ``all`` has every extra).
EXTRA_OF: dict[str, str] = {
    "nltk": "eval",
    "tqdm": "eval",
    "optuna": "optimize",
    "huggingface_hub": "local",
    "llama_cpp": "local",
    "sentence_transformers": "local",
    "fastembed": "onnx",
    "onnxruntime": "onnx",
    "onnx": "onnx-export",
    "onnxscript": "onnx-export",
    "mlflow": "mlflow",
    "pandas": "mlflow",
    "matplotlib": "mlflow",
    "weaviate": "weaviate",
    "fastapi": "serve",
    "uvicorn": "serve",
    "mcp": "serve",
}

#: extra → the extras it pulls in (``pyproject.toml``: ``eval`` has ``mlflow``, ``optimize`` has ``eval``...).
INCLUDES: dict[str, frozenset[str]] = {
    "eval": frozenset({"eval", "mlflow"}),
    "optimize": frozenset({"optimize", "eval", "mlflow"}),
    "local": frozenset({"local", "onnx"}),
}

#: command of ``nemori-dspy`` → the extra it needs (a module missing from it is reported as that extra).
COMMAND_EXTRA: dict[str, str] = {"eval": "eval", "report": "eval", "optimize": "optimize", "serve": "serve"}


def require(module: str, purpose: str | None = None, extra: str | None = None) -> ModuleType:
    """Import and return ``module``, or raise the error naming the extra that installs it.

    Args:
        module: dotted module name; its top-level package decides the extra (``EXTRA_OF``).
        purpose: what needs it, for the message (e.g. ``"--optimizer mipro"``).
        extra: the extra the caller needs, named when it installs the module (see ``extra_error``).
    Raises:
        MissingExtraError: the module (or its top-level package) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        err = extra_error(exc, purpose, extra)
        if err is None:
            raise
        raise err from exc


def extra_error(exc: ModuleNotFoundError, purpose: str | None = None,
                extra: str | None = None) -> MissingExtraError | None:
    """The ``MissingExtraError`` for a failed import of an extra's module, or None when ``exc`` is about a
    module no extra provides (a real bug, to be raised as it is).

    Args:
        purpose: what needed it, for the message.
        extra: the extra the caller needs (e.g. a command's, ``COMMAND_EXTRA``): named when it installs the
            missing module (``optimize`` for ``nltk`` under ``nemori-dspy optimize``); otherwise the module's own
            extra is named (``weaviate`` for ``weaviate`` under any command).
    """
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    own = EXTRA_OF[top]
    named = extra if extra is not None and own in INCLUDES.get(extra, frozenset({extra})) else own
    return MissingExtraError(named, top, purpose)
