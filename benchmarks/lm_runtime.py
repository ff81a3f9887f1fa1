"""The model a benchmark runs on, from its ``--lm`` string: one switch shared by the benchmarks.

``scripted`` is the instant scripted LM (``nemori_dspy.testing``: no model, no network; smoke tests);
``local:<size>`` a local Qwen2.5-Coder GGUF through llama.cpp; anything else a litellm model string.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator

__all__ = ["SCRIPTED", "lm_overrides", "lm_runtime", "scratch_memory"]

#: the ``--lm`` value of the scripted LM
SCRIPTED = "scripted"


def lm_overrides(lm: str) -> dict[str, Any]:
    """Settings fields that select ``lm``: ``{}`` for ``scripted``, ``{"model": "local", "local_model_size": "0.5b"}``
    for ``local:0.5b``, ``{"model": lm}`` otherwise."""
    if lm == SCRIPTED:
        return {}
    if lm.startswith("local:"):
        return {"model": "local", "local_model_size": lm.split(":", 1)[1]}
    return {"model": lm}


@contextmanager
def lm_runtime(lm: str, settings: Any) -> Iterator[Any]:
    """The runtime of ``lm`` for the length of the block.

    ``scripted``: DSPy configured with the scripted LM and the chat adapter; yields a stand-in runtime with no
    stage models (``stage_lms={}``, ``judge_lm=None``, labels ``"scripted"``). Otherwise
    ``nemori_dspy.runtime.build_runtime(settings)`` (which starts and stops local servers).

    Raises:
        ConfigError / ProviderError: from ``build_runtime`` (bad model string, a server that does not start).
    """
    if lm == SCRIPTED:
        import dspy

        from nemori_dspy.testing import ScriptedLM, default_responders

        with dspy.context(lm=ScriptedLM(default_responders()), adapter=dspy.ChatAdapter()):
            yield SimpleNamespace(stage_lms={}, judge_lm=None, model_label=SCRIPTED, judge_label=SCRIPTED)
        return
    from nemori_dspy.runtime import build_runtime

    with build_runtime(settings) as rt:
        yield rt


@contextmanager
def scratch_memory(settings: Any, lm: str, program: dict[str, Any] | None = None) -> Iterator[Any]:
    """A throw-away ``Memory`` (SQLite in a temporary folder, deleted after the block) whose stages run on ``lm``
    (``lm_runtime``) with ``settings``, ``program`` (a saved pipeline state) applied when given: for benchmarks that
    call one stage directly and need no stored memory.

    Raises:
        ConfigError / ProviderError: from ``lm_runtime``.
    """
    import tempfile
    from pathlib import Path

    from nemori_dspy.apps.context import build_memory
    from nemori_dspy.embedders import resolve_embedder
    from nemori_dspy.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "m.sqlite3")
        try:
            with lm_runtime(lm, settings) as rt:
                yield build_memory(settings, store, resolve_embedder(settings), rt.stage_lms or None, program)
        finally:
            store.close()
