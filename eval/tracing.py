"""MLflow traces of an eval: every LLM call is one span named after its pipeline stage, inside one trace per
unit of work (one memory-construction window of a conversation, one answered question of one system).

A DSPy callback (``LMSpans``, installed with ``dspy.context(callbacks=...)`` only while tracing) opens a
span at ``on_lm_start`` and closes it at ``on_lm_end`` with the call's inputs (messages), outputs (reply
texts), the stage (``nemori.stage``, from ``nemori_dspy.usage.current_stage``), the model, and the token usage
of that very call (``mlflow.chat.tokenUsage``; a reply served from DSPy's cache has no usage and is marked
``nemori.cache_hit``); the span's duration is the call's latency. ``mlflow.dspy.autolog`` is not used for
evals: its spans name the Python class (``StagePredict.forward``), not the stage, and its token usage sits on
module spans rather than on each call.

``trace_group`` opens the root span of one unit of work and links its trace to the eval's MLflow run
(``mlflow.sourceRun``), with the conversation / question / system as trace tags, so a bad answer leads to
the prompt and reply behind it. Cost: see docs/measurements.md for seconds per 1,000 calls
(``benchmarks/tracing_cost.py``).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from dspy.utils.callback import BaseCallback

from nemori_dspy.usage import current_stage

__all__ = ["LMSpans", "trace_group", "call_usage"]

log = logging.getLogger(__name__)

_HISTORY_LOOKBACK = 64  # history entries searched (newest first) for the one a call appended


def call_usage(lm: Any, messages: Any, prompt: Any) -> dict[str, int] | None:
    """The usage dict (``prompt_tokens``, ``completion_tokens``) of the history entry ``lm`` appended for
    the call made with exactly these ``messages`` / ``prompt`` objects (identity, so concurrent calls on one
    LM never swap usage). ``{}`` for a cache hit; None when no entry is found (history off)."""
    history = getattr(lm, "history", None) or []
    for entry in reversed(history[-_HISTORY_LOOKBACK:]):
        if (messages is not None and entry.get("messages") is messages) or \
                (messages is None and prompt is not None and entry.get("prompt") is prompt):
            return dict(entry.get("usage") or {})
    return None


class LMSpans(BaseCallback):
    """DSPy callback: one MLflow span per LM call (see the module docstring). Thread-safe.

    ``run_id``: the MLflow run a call made outside any ``trace_group`` (its own trace) is linked to.
    """

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self._open: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        import mlflow
        from mlflow.entities import SpanType
        from mlflow.tracing.provider import set_span_in_context

        name = current_stage()
        messages, prompt = inputs.get("messages"), inputs.get("prompt")
        parent = mlflow.get_current_active_span()
        span = mlflow.start_span_no_context(
            name=name, span_type=SpanType.CHAT_MODEL, parent_span=parent,
            metadata={"mlflow.sourceRun": self.run_id} if parent is None and self.run_id else None,
            inputs={"messages": messages} if messages is not None else {"prompt": prompt},
            attributes={"nemori.stage": name, "model": str(getattr(instance, "model", "")),
                        **{f"lm.{k}": v for k, v in (inputs.get("kwargs") or {}).items()
                           if isinstance(v, (str, int, float, bool))}})
        token = set_span_in_context(span)
        with self._lock:
            self._open[call_id] = (span, token, instance, messages, prompt)

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        from mlflow.entities import SpanEvent, SpanStatusCode
        from mlflow.tracing.constant import SpanAttributeKey
        from mlflow.tracing.provider import detach_span_from_context

        with self._lock:
            opened = self._open.pop(call_id, None)
        if opened is None:
            return
        span, token, lm, messages, prompt = opened
        try:
            usage = call_usage(lm, messages, prompt)
            if usage is not None:
                inp = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
                out = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
                span.set_attributes({"nemori.input_tokens": inp, "nemori.output_tokens": out,
                                     "nemori.cache_hit": inp == 0 and out == 0,
                                     SpanAttributeKey.CHAT_USAGE: {"input_tokens": inp, "output_tokens": out,
                                                                   "total_tokens": inp + out}})
            if exception is not None:
                span.add_event(SpanEvent.from_exception(exception))
            span.end(outputs=outputs, status=SpanStatusCode.OK if exception is None else SpanStatusCode.ERROR)
        finally:
            detach_span_from_context(token)


@contextmanager
def trace_group(name: str, run_id: str | None, **tags: Any) -> Iterator[Any]:
    """Root span ``name`` of one unit of work; LM spans made inside become its children.

    ``run_id``: the MLflow run the trace belongs to (trace metadata ``mlflow.sourceRun``); ``tags``
    (e.g. ``conversation="conv-26"``, ``question=3``, ``system="nemori"``) become trace tags and span
    attributes. Yields the span.
    """
    import mlflow

    metadata = {"mlflow.sourceRun": run_id} if run_id else None
    with mlflow.start_span(name=name, span_type="CHAIN", attributes={f"nemori.{k}": v for k, v in tags.items()}) as span:
        try:
            mlflow.update_current_trace(tags={k: str(v) for k, v in tags.items()}, metadata=metadata)
        except (TypeError, ValueError) as exc:  # an older tracing API: the trace is still recorded
            log.debug("trace tags not set: %s", exc)
        yield span
