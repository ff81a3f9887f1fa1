"""Per-stage LLM accounting: real calls, cache hits, failures, tokens, seconds and dollars; embedding
calls are kept apart (``UsageLedger.embedding``) so they never mix into the LLM stage tables.

Usage is scoped, never process-global: a ``UsageLedger`` is charged only for the calls made while it is
active (``with ledger.charging():``). Each ``Memory`` owns one (``Memory.usage``) and activates it in its
public methods; an eval or optimization run activates its own around the whole run; ``ledger.scope()``
charges a block to a fresh child as well (e.g. the usage of one ``answer`` call). Active ledgers nest:
a call is charged to every ledger active around it, so a run's ledger holds the sum of the memories it
drives plus its judge calls. There is no process total other than such a sum (``UsageLedger.merged``).

Every LM call made inside ``stage("narrate")`` is charged to ``narrate``. Stage and active ledgers live
in context variables, so concurrent threads/tasks keep their own. The active ledgers are kept in DSPy's
``thread_local_overrides`` (the variable ``dspy.context`` sets), so they follow a call into the threads
DSPy's ``ParallelExecutor`` starts (``dspy.Evaluate(num_threads=...)``, optimizers), into
``asyncio.to_thread`` and into ``contextvars.copy_context().run``; a bare ``threading.Thread`` starts
with none active (its calls are charged to no ledger: run it through ``copy_context().run``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from dspy.dsp.utils.settings import thread_local_overrides
from dspy.dsp.utils.utils import dotdict

from .types import Usage

__all__ = ["UsageLedger", "stage", "current_stage", "UsageTrackingMixin", "embedding_call", "tally",
           "active_ledgers", "charging", "watch_truncation", "note_truncation", "finish_reasons"]

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("nemori_stage", default="other")
#: key of the active ledgers (a tuple, outermost first) in DSPy's thread_local_overrides.
_LEDGERS_KEY = "nemori_usage_ledgers"


_TRUNCATIONS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("nemori_truncations", default=None)


@contextmanager
def watch_truncation() -> Iterator[list[str]]:
    """Collect, for the calls made in this block (this thread/task), one note per LM reply that was cut
    by its token cap (finish_reason ``"length"``). The yielded list is empty when no reply was cut."""
    seen: list[str] = []
    token = _TRUNCATIONS.set(seen)
    try:
        yield seen
    finally:
        _TRUNCATIONS.reset(token)


def note_truncation(source: str) -> None:
    """Record a truncated reply in the innermost ``watch_truncation`` block, if any."""
    seen = _TRUNCATIONS.get()
    if seen is not None:
        seen.append(source)


def finish_reasons(response: Any) -> list[str]:
    """Finish reasons of an LM response: ``response.finish_reason`` (dspy.lm15) or those of its
    ``choices`` (litellm/OpenAI); [] when it has neither."""
    if response is None:
        return []
    direct = getattr(response, "finish_reason", None)
    if direct is not None:
        return [str(direct)]
    choices = getattr(response, "choices", None) or (response.get("choices") if isinstance(response, dict) else None)
    out = []
    for c in choices or []:
        r = c.get("finish_reason") if isinstance(c, dict) else getattr(c, "finish_reason", None)
        if r is not None:
            out.append(str(r))
    return out


def current_stage() -> str:
    """Name of the stage the calling code runs in (``"other"`` outside any stage)."""
    return _STAGE.get()


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Charge every LM call inside the block to stage ``name``."""
    token = _STAGE.set(name)
    try:
        yield
    finally:
        _STAGE.reset(token)


def active_ledgers() -> tuple["UsageLedger", ...]:
    """The ledgers charged for a call made here (this thread/task), outermost first; () when none is active."""
    return tuple(thread_local_overrides.get().get(_LEDGERS_KEY, ()))


@contextmanager
def charging(*ledgers: "UsageLedger") -> Iterator[None]:
    """Charge the calls made in this block (this thread/task, and threads that copy its context) to
    ``ledgers`` too, besides the ledgers already active. A ledger already active is not added twice."""
    outer = active_ledgers()
    stack = outer + tuple(led for i, led in enumerate(ledgers)
                          if all(led is not o for o in (*outer, *ledgers[:i])))
    token = thread_local_overrides.set(dotdict({**thread_local_overrides.get(), _LEDGERS_KEY: stack}))
    try:
        yield
    finally:
        thread_local_overrides.reset(token)


def tally(name: str, n: int = 1) -> None:
    """Increment counter ``name`` (e.g. ``partition_repairs``) in every active ledger."""
    for ledger in active_ledgers():
        ledger.count(name, n)


def _charge_stage(**delta: Any) -> None:
    for ledger in active_ledgers():
        ledger.add_stage(current_stage(), **delta)


def _response_delta(usage: dict | None, cost: float | None) -> dict[str, Any]:
    """``Usage`` fields of one LM response; an empty usage counts as a cache hit."""
    usage = usage or {}
    inp = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
    out = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    if inp == 0 and out == 0:
        return {"cache_hits": 1}
    return {"calls": 1, "input_tokens": inp, "output_tokens": out, "cost_usd": float(cost or 0.0)}


def charge_response(usage: dict | None, cost: float | None) -> None:
    """Charge one LM response to the current stage of every active ledger (an empty usage counts as a
    cache hit); each charged ledger's ``listeners`` are then called with the stage name."""
    for ledger in active_ledgers():
        ledger.record_response(usage, cost)


def charge_time(seconds: float, failed: bool = False) -> None:
    """Add wall ``seconds`` (and a failure, if the call raised) to the current stage of every active ledger."""
    _charge_stage(seconds=seconds, failures=int(failed))


class UsageLedger:
    """Thread-safe totals per stage, plus named counters (cache-bypass retries, repairs, ...), of the
    calls made while it was active (``charging``). The ``record_*``/``count`` methods charge this ledger
    only; code that makes calls uses the module functions (``tally``, ``charge_response`` ...), which
    charge every active ledger."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stages: dict[str, Usage] = {}
        self.counters: dict[str, int] = {}
        #: embedder usage: ``calls`` = embed() batches, ``input_tokens`` when the provider reports them,
        #: ``seconds`` wall time, ``cost_usd`` from litellm; the number of texts is ``embedding_texts``.
        self.embedding = Usage()
        self.embedding_texts = 0
        #: called with the stage name after each LM response charged to this ledger (e.g. a progress bar).
        self.listeners: list[Callable[[str], None]] = []

    @contextmanager
    def charging(self) -> Iterator["UsageLedger"]:
        """Activate this ledger for the block (see ``charging``); yields it."""
        with charging(self):
            yield self

    @contextmanager
    def scope(self) -> Iterator["UsageLedger"]:
        """Charge the calls made in this block to this ledger and also to a fresh one, which is yielded
        (this thread/task, and threads that copy its context)."""
        local = UsageLedger()
        with charging(self, local):
            yield local

    @classmethod
    def merged(cls, ledgers: Iterable["UsageLedger"]) -> "UsageLedger":
        """A new ledger holding the sum of ``ledgers`` (e.g. the total of several memories)."""
        out = cls()
        for led in ledgers:
            out.absorb({k: v.model_dump() for k, v in led.snapshot().items()}, dict(led.counters),
                       led.embedding_summary())
        return out

    def add_stage(self, name: str, **delta: Any) -> None:
        """Add ``delta`` (``Usage`` fields) to stage ``name`` of this ledger."""
        with self._lock:
            self.stages[name] = self.stages.get(name, Usage()).add(Usage(**delta))

    def record_response(self, usage: dict | None, cost: float | None) -> None:
        """Charge one LM response to the current stage, in this ledger only (``charge_response``: all
        active ones); an empty usage counts as a cache hit. Then calls ``listeners`` with the stage name."""
        name = current_stage()
        self.add_stage(name, **_response_delta(usage, cost))
        for listener in list(self.listeners):
            listener(name)

    def record_embedding(self, texts: int, seconds: float, tokens: int = 0, cost: float = 0.0) -> None:
        """Charge one embed() call of ``texts`` texts to the embedding totals (not to any LLM stage)."""
        with self._lock:
            self.embedding = self.embedding.add(Usage(calls=1, input_tokens=tokens, seconds=seconds, cost_usd=cost))
            self.embedding_texts += texts
    def absorb(self, stages: dict[str, dict[str, Any]], counters: dict[str, int] | None = None,
               embedding: dict[str, float] | None = None) -> None:
        """Add figures saved by an earlier invocation (``summary.json``'s ``usage``, ``counters``,
        ``embedding_usage``), so a resumed run reports the whole run's cost, not only the last part."""
        with self._lock:
            for name, fields in stages.items():
                self.stages[name] = self.stages.get(name, Usage()).add(Usage(**fields))
            for name, n in (counters or {}).items():
                self.counters[name] = self.counters.get(name, 0) + int(n)
            if embedding:
                self.embedding = self.embedding.add(Usage(
                    calls=int(embedding.get("calls", 0)), input_tokens=int(embedding.get("tokens", 0)),
                    seconds=float(embedding.get("seconds", 0.0)), cost_usd=float(embedding.get("cost_usd", 0.0))))
                self.embedding_texts += int(embedding.get("texts", 0))

    def embedding_summary(self) -> dict[str, float]:
        """``{"calls", "texts", "tokens", "seconds", "cost_usd"}`` of the embedding totals."""
        with self._lock:
            e = self.embedding
            return {"calls": e.calls, "texts": self.embedding_texts, "tokens": e.input_tokens,
                    "seconds": round(e.seconds, 3), "cost_usd": e.cost_usd}

    def record_time(self, seconds: float, failed: bool = False) -> None:
        """Add wall seconds (and a failure, if the call raised) to the current stage of this ledger."""
        self.add_stage(current_stage(), seconds=seconds, failures=int(failed))

    def count(self, name: str, n: int = 1) -> None:
        """Increment a named counter of this ledger (``tally``: of every active one)."""
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def snapshot(self) -> dict[str, Usage]:
        """A copy of the per-stage totals."""
        with self._lock:
            return {k: v.model_copy() for k, v in self.stages.items()}

    def total(self, stages: list[str] | None = None) -> Usage:
        """Sum over ``stages`` (all when None)."""
        out = Usage()
        for k, v in self.snapshot().items():
            if stages is None or k in stages:
                out = out.add(v)
        return out

    def reset(self) -> None:
        """Forget all totals and counters."""
        with self._lock:
            self.stages.clear()
            self.counters.clear()
            self.embedding, self.embedding_texts = Usage(), 0

    def table(self, local: bool = False) -> str:
        """Plain-text table: one row per stage with calls, cache hits, failures, tokens, seconds, $
        (``local=True``: a $ of 0 reads ``local``, as in the cost tables)."""
        def money(cost: float) -> str:
            return f"{'local' if local and cost == 0 else f'{cost:.4f}':>9}"

        head = f"{'stage':<15}{'calls':>7}{'cached':>8}{'failed':>8}{'in tok':>10}{'out tok':>9}{'seconds':>10}{'$':>9}"
        lines = [head, "-" * len(head)]
        snap = self.snapshot()
        for name in sorted(snap, key=lambda s: (s == "other", s)):
            u = snap[name]
            lines.append(f"{name:<15}{u.calls:>7}{u.cache_hits:>8}{u.failures:>8}{u.input_tokens:>10}"
                         f"{u.output_tokens:>9}{u.seconds:>10.1f}{money(u.cost_usd)}")
        t = self.total()
        lines.append(f"{'total':<15}{t.calls:>7}{t.cache_hits:>8}{t.failures:>8}{t.input_tokens:>10}"
                     f"{t.output_tokens:>9}{t.seconds:>10.1f}{money(t.cost_usd)}")
        return "\n".join(lines)


@contextmanager
def embedding_call(texts: int) -> Iterator[dict[str, float]]:
    """Time one embed() call of ``texts`` texts and charge it to the embedding totals of every active ledger.

    Yields a dict where the embedder may put provider-reported ``tokens`` and ``cost`` (USD).
    Nothing is charged when the block raises.
    """
    extra: dict[str, float] = {"tokens": 0, "cost": 0.0}
    t0 = time.perf_counter()
    yield extra
    seconds = time.perf_counter() - t0
    for ledger in active_ledgers():
        ledger.record_embedding(texts, seconds, int(extra["tokens"]), float(extra["cost"] or 0.0))


class UsageTrackingMixin:
    """Mix into a ``dspy.BaseLM`` subclass so its calls are charged by stage to the active ledgers.

    An LM with ``charge_stage`` set (e.g. ``"reflection"`` for an optimizer's prompt/reflection model) charges
    every call to that name whatever stage is running, so an optimization's cost splits per model.
    """

    charge_stage: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.charge_stage:
            with stage(self.charge_stage):
                return self._tracked_call(*args, **kwargs)
        return self._tracked_call(*args, **kwargs)

    def _tracked_call(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            out = super().__call__(*args, **kwargs)  # type: ignore[misc]
        except BaseException:
            charge_time(time.perf_counter() - t0, failed=True)
            raise
        charge_time(time.perf_counter() - t0)
        return out

    def update_history(self, entry: dict) -> None:
        charge_response(entry.get("usage"), entry.get("cost"))
        if "length" in finish_reasons(entry.get("response")):
            note_truncation("finish_reason")
        super().update_history(entry)  # type: ignore[misc]
