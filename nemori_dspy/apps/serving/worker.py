"""Background processing for servers: messages are stored on the request path, processed here.

One job per user at a time (so a user's episodes form in message order, §3.2.1), up to ``threads``
users in parallel. A job processes one window per ``Memory.process`` call and checks for
shutdown between windows, so stopping waits for at most one window per running user. Nothing is
lost by stopping: messages are durable in the store before a job is scheduled, and ``start()``
schedules every user that still has pending messages or undistilled episodes (restart recovery).
A ``flush`` requested before a stop is not remembered: after a restart a partial window waits for
more messages or the next flush.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import dspy
from pydantic import BaseModel, Field

from ...errors import NemoriError
from ...memory import Memory

__all__ = ["BackgroundProcessor", "WorkerState", "WorkerSummary"]

log = logging.getLogger(__name__)


class WorkerState(BaseModel):
    """One user's background processing, as ``BackgroundProcessor.state`` reports it."""

    processing: bool = Field(description="a pass is queued or running")
    last_error: str | None = Field(default=None, description="the error that ended the latest pass; None if it "
                                   "succeeded or none ran")
    passes: int = Field(ge=0, description="passes run for the user since the worker was made")


class WorkerSummary(BaseModel):
    """Process-wide worker figures, without user ids (``BackgroundProcessor.summary``)."""

    threads: int = Field(ge=0, description="users processed at once; 0 = store only, never process")
    users_processing: int = Field(ge=0, description="users with a pass running now")
    stopping: bool = Field(description="``stop`` was called: no new passes start")


@dataclass
class _UserState:
    dirty: bool = False        # work was requested since the job last looked
    force: bool = False        # ... and it includes a flush
    running: bool = False
    last_error: str | None = None
    passes: int = 0


class BackgroundProcessor:
    """Per-user background worker over one ``Memory``.

    Args:
        memory: the memory to process.
        threads: users processed at once (each user's work is sequential). 0 = store only, never
            process (e.g. an ingest-only node; another process or ``flush`` does the work).
        lm / adapter: DSPy LM and adapter for worker threads; None = the globally configured ones
            (``dspy.configure`` at the entry point).
        tracer: traces each processing pass and each request that asks (``traced``) into MLflow
            (``serving.tracing.ServeTracer``, setting ``serve_tracing``); None = no traces.
    """

    def __init__(self, memory: Memory, threads: int = 2, lm: Any = None, adapter: Any = None,
                 tracer: Any = None) -> None:
        if threads < 0:
            raise ValueError("threads must be >= 0")
        self.memory = memory
        self.threads = threads
        self.tracer = tracer
        self._ctx = {k: v for k, v in (("lm", lm), ("adapter", adapter)) if v is not None}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nemori-worker") if threads else None
        self._states: dict[str, _UserState] = {}
        self._lock = threading.Condition()
        self._stopping = False

    @contextlib.contextmanager
    def dspy_context(self) -> Iterator[None]:
        """The LM context worker and request threads run DSPy calls in."""
        if self._ctx:
            with dspy.context(**self._ctx):
                yield
        else:
            yield

    def traced(self, name: str, **tags: Any) -> Any:
        """A context manager: one MLflow trace ``name`` tagged with ``tags`` around the block when this
        processor has a tracer, else nothing."""
        return self.tracer.span(name, **tags) if self.tracer is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ control
    def start(self, resume: bool = True) -> list[str]:
        """Begin; with ``resume``, schedule every user with pending work in the store. Returns them."""
        resumed = []
        if resume and self._pool is not None:
            for user in self.memory.store.list_users():
                st = self.memory.store.stats(user)
                if st.get("pending", 0) >= self.memory.settings.window_size or st.get("to_distill", 0):
                    self.schedule(user)
                    resumed.append(user)
        if resumed:
            log.info("resumed background work for %d user(s)", len(resumed))
        return resumed

    def schedule(self, user_id: str, force: bool = False) -> bool:
        """Ask for a processing pass of ``user_id`` (``force`` = flush: also a partial window).
        Returns False when nothing will run (``threads == 0`` or stopping)."""
        with self._lock:
            if self._pool is None or self._stopping:
                return False
            st = self._states.setdefault(user_id, _UserState())
            st.dirty, st.force = True, st.force or force
            if not st.running:
                st.running = True
                self._pool.submit(self._run, user_id).add_done_callback(self._crashed)
            return True

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Stop after the current window of each running job; True if all jobs ended in ``timeout``."""
        with self._lock:
            self._stopping = True
            done = self._lock.wait_for(lambda: not any(s.running for s in self._states.values()), timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=done, cancel_futures=True)
        return done

    def wait_idle(self, user_id: str, timeout: float | None = None) -> bool:
        """Block until ``user_id`` has no queued or running job; True if so within ``timeout``."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._busy(user_id), timeout)

    def _busy(self, user_id: str) -> bool:
        st = self._states.get(user_id)
        return st is not None and (st.running or st.dirty)

    def state(self, user_id: str) -> WorkerState:
        """One user's processing state (a user never scheduled: not processing, no error, 0 passes)."""
        with self._lock:
            st = self._states.get(user_id, _UserState())
            return WorkerState(processing=st.running or st.dirty, last_error=st.last_error, passes=st.passes)

    def summary(self) -> WorkerSummary:
        """Process-wide figures without user ids: worker threads and users being processed."""
        with self._lock:
            return WorkerSummary(threads=self.threads, users_processing=sum(s.running for s in self._states.values()),
                                 stopping=self._stopping)

    # ------------------------------------------------------------------ the job
    def _run(self, user_id: str) -> None:
        try:
            with self.dspy_context():
                while True:
                    with self._lock:
                        st = self._states[user_id]
                        if not st.dirty or self._stopping:
                            return
                        force, st.dirty, st.force = st.force, False, False
                    self._pass(user_id, force, st)
        finally:
            with self._lock:
                self._states[user_id].running = False
                self._lock.notify_all()

    def _pass(self, user_id: str, force: bool, st: _UserState) -> None:
        """Process window by window until the buffer holds less than a window (or all, if ``force``)."""
        try:
            while not self._stopping:
                with self.traced("process", operation="process", user_id=user_id):
                    report = self.memory.process(user_id, force=force, max_windows=1)
                if report.windows == 0 or report.parked:
                    break
            st.last_error = None
        except NemoriError as exc:  # store trouble: the messages stay stored; the next request retries
            st.last_error = str(exc)
            log.warning("background processing of %r failed: %s", user_id, exc)
        st.passes += 1

    @staticmethod
    def _crashed(fut: Future) -> None:
        exc = fut.exception()
        if exc is not None:  # a bug, not a store/LLM error: log it loudly; the messages stay stored
            log.error("background worker crashed", exc_info=exc)
