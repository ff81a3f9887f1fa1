"""Test-only entry point: ``python -m tests.serve_entry <nemori-dspy args>`` runs the real CLI with
the LLM replaced by ``ScriptedLM`` (default responders). Production code has no switch for this:
the entry swaps ``runtime.build_runtime`` before calling ``apps.cli.main``. Use with
``NEMORI_EMBEDDER=hashing-64`` so no embedding model is loaded either."""

from __future__ import annotations

import sys

import dspy

import nemori_dspy.runtime as runtime
from nemori_dspy.apps.cli import main
from nemori_dspy.runtime import Runtime
from tests.fakes import ScriptedLM, default_responders


def scripted_runtime(settings):
    """A ``Runtime`` whose LM is scripted; configured globally as ``build_runtime`` would."""
    lm = ScriptedLM(default_responders())
    dspy.configure(lm=lm, adapter=dspy.ChatAdapter())
    return Runtime(settings=settings, lm=lm, judge_lm=lm, model_label="scripted", judge_label="scripted")


if __name__ == "__main__":
    runtime.build_runtime = scripted_runtime
    sys.exit(main(sys.argv[1:]))
