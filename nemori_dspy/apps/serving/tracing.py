"""Opt-in MLflow traces of ``serve http`` and ``serve mcp`` (setting ``serve_tracing``, off by default; ``--trace``).

When on, each unit of server work is one MLflow trace: a REST ``search`` / ``answer`` request, an MCP tool call,
and each background processing pass of a user (one window). Its LLM calls are spans inside it, one per call,
named after the pipeline stage with the call's messages, reply, tokens and latency (the eval's
``eval.tracing.LMSpans``), and the trace is tagged with the ``user_id`` and the operation. Traces go to the
tracking store of ``mlflow_tracking_uri`` in the experiment ``<mlflow_experiment>-serve``. They hold what users
said: turn them on only where that store may keep it.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.extras import require

__all__ = ["ServeTracer", "serve_tracer", "traced_ops"]

log = logging.getLogger(__name__)


class ServeTracer:
    """Traces of one server into MLflow (see the module docstring).

    Args:
        settings: ``mlflow_tracking_uri`` and ``mlflow_experiment`` say where the traces go.
    Raises:
        MissingExtraError: MLflow is not installed (``pip install "nemori-dspy[mlflow]"``).
    """

    def __init__(self, settings: NemoriSettings) -> None:
        mlflow = require("mlflow", "serve tracing (--trace)")

        from nemori_dspy.eval.tracing import LMSpans
        from nemori_dspy.eval.tracking import set_experiment, tracking_uri

        self.uri = tracking_uri(settings)
        self.experiment = f"{settings.mlflow_experiment}-serve"
        mlflow.set_tracking_uri(self.uri)
        self.experiment_id = set_experiment(mlflow, self.uri, self.experiment)
        self.spans = LMSpans(None)

    @contextmanager
    def span(self, name: str, **tags: Any) -> Iterator[Any]:
        """One trace named ``name`` (e.g. ``answer``) tagged with ``tags`` (``user_id=...``); the LLM calls made in
        the block (this thread) are its spans. Yields the root span."""
        from nemori_dspy.eval.tracing import trace_group

        with dspy.context(callbacks=[*dspy.settings.get("callbacks", []), self.spans]):
            with trace_group(name, None, **tags) as root:
                yield root

    def close(self) -> None:
        """Write out the traces still queued (MLflow exports them in the background)."""
        mlflow = require("mlflow", "serve tracing (--trace)")

        mlflow.flush_trace_async_logging()


def serve_tracer(settings: NemoriSettings) -> ContextManager[ServeTracer | None]:
    """A ``ServeTracer`` when ``settings.serve_tracing`` (closed on exit), else None; use as ``with``."""
    if not settings.serve_tracing:
        return nullcontext(None)

    @contextmanager
    def opened() -> Iterator[ServeTracer]:
        tracer = ServeTracer(settings)
        log.info("serve: tracing requests into MLflow experiment %r at %s", tracer.experiment, tracer.uri)
        try:
            yield tracer
        finally:
            tracer.close()

    return opened()


class _TracedOps:
    """``MemoryOps`` whose every public method call is one trace (``mcp <method>``, tagged with its ``user_id``)."""

    def __init__(self, ops: Any, tracer: ServeTracer) -> None:
        self._ops, self._tracer = ops, tracer

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ops, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            user = kwargs.get("user_id", args[0] if args and isinstance(args[0], str) else None)
            with self._tracer.span(f"mcp {name}", operation=name, **({"user_id": user} if user else {})):
                return attr(*args, **kwargs)

        return call


def traced_ops(ops: Any, tracer: ServeTracer | None) -> Any:
    """``ops`` (a ``tools.MemoryOps``) with each call traced by ``tracer``; ``ops`` itself without a tracer."""
    return ops if tracer is None else _TracedOps(ops, tracer)
