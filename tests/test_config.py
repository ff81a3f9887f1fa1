"""Settings module: its documentation names functions that exist."""

from __future__ import annotations

import importlib
import re

import nemori_dspy.config as config


def test_every_function_the_config_docstring_names_exists():
    named = re.findall(r"``(nemori_dspy(?:\.\w+)+)``", config.__doc__ or "")
    assert named, "the docstring names the entry point that consumes the settings"
    for dotted in named:
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted
