"""The LoCoMo harness: build memory per conversation, answer categories 1-4 with every selected system
(same answer signature for all), score (LLM judge, token F1, BLEU-1, LoCoMo F1, evidence recall@k),
checkpoint every answer, and summarise per system and category.

``EvalOptions.concurrency`` threads build conversations and then answer and judge questions (``answer_tasks``, a
``ThreadPoolExecutor``; each task runs in a copy of the caller's context, so ``dspy.context`` overrides and the
run's usage ledger follow it). Each row is checkpointed by the thread that made it as soon as it is scored;
the observer and ``cost.json`` are updated from the calling thread only; at the end ``results.jsonl`` and the
summary list the rows in question order (conversation, question as asked, system), whatever order threads
finished in, so a threaded run's files read like a sequential run's. A question refused for rate limits after
litellm's retries is asked again after a pause shared by every thread; if it is still refused it is left
unanswered (never scored as wrong) for ``--resume``.

DSPy's ``ParallelExecutor`` is not used here: it resubmits a straggling task (a question could be answered and
checkpointed twice), leaves tasks running after it returns, and turns a task's exception into a result."""

from __future__ import annotations

import contextvars
import json
import os
from contextlib import nullcontext
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, ContextManager, NamedTuple, Protocol

import dspy
import litellm
from tqdm.auto import tqdm

from nemori_dspy.errors import LLMError, RateLimitedError
from nemori_dspy.memory import Memory
from nemori_dspy.recording import recording
from nemori_dspy.stages import CONSTRUCTION_STAGES as _STAGES
from nemori_dspy.store.base import MemoryStore
from nemori_dspy.usage import Usage, UsageLedger, tally
from nemori_dspy.eval.baselines import RagIndex, context_budget_chars, full_context
from nemori_dspy.eval.judge import JudgePanel, LLMJudge, as_panel
from nemori_dspy.eval.judge_audit import audit_table
from nemori_dspy.eval.locomo import CATEGORY_NAMES, SCORED_CATEGORIES, LoCoMoConversation, LoCoMoQuestion
from nemori_dspy.eval.locomo import stratified_questions
from nemori_dspy.eval.metrics import paired_stats, paired_table_from_stats
from nemori_dspy.eval.metrics import Group, bleu1, category_table, evidence_recall_at_k, f1_locomo, scored_groups, token_f1
from nemori_dspy.eval.summary import RunResult
from nemori_dspy.eval.systems import SYSTEMS, System

__all__ = ["EvalOptions", "RunObserver", "NullObserver", "MemoryProvider", "SharedMemory", "ingest_conversation", "episode_coverage",
           "run_locomo", "answer_and_score", "answer_question", "CONSTRUCTION_STAGES", "METRICS", "RECALL_KS",
           "judge_verdicts",
           "system_context", "PreparedContext", "prepare_context", "context_tokens", "recall_scores", "summarise", "AnswerTask", "answer_tasks",
           "locomo_tasks", "answered_keys", "RATE_LIMIT_WAIT_S", "RATE_LIMIT_MAX_WAIT_S"]

log = logging.getLogger(__name__)

#: one ``RunObserver.answered`` call at a time across answer threads (the tracker's MLflow writes).
_OBSERVE_LOCK = threading.Lock()

#: the stages that build memory, in pipeline order (``nemori_dspy.stages``).
CONSTRUCTION_STAGES = list(_STAGES)
METRICS = ["judge", "f1", "bleu1", "f1_locomo"]
RECALL_KS = (1, 2, 5, 10)
#: seconds every answer thread pauses after a question was refused for rate limits (litellm has already retried
#: the call ``num_retries`` times with its own exponential backoff); doubled per further refusal of that question,
#: at most ``RATE_LIMIT_MAX_WAIT_S``, and never less than the provider's ``Retry-After``.
RATE_LIMIT_WAIT_S = 10.0
RATE_LIMIT_MAX_WAIT_S = 120.0


class RunObserver(Protocol):
    """Watches an eval as it runs (``eval.tracking.EvalTracker`` logs to MLflow live).

    ``span(name, **tags)``: a context manager around one unit of work (one construction window of a
    conversation, one answered question of one system); ``answered(row)``: called once per new answer row,
    right after it is checkpointed, still inside the answer's ``span`` (so a tracker can attach the row's
    verdicts to that answer's trace).
    """

    def span(self, name: str, **tags: Any) -> ContextManager[Any]: ...

    def answered(self, row: dict[str, Any]) -> None: ...


class NullObserver:
    """A ``RunObserver`` that does nothing (the default)."""

    def span(self, name: str, **tags: Any) -> ContextManager[Any]:
        return nullcontext()

    def answered(self, row: dict[str, Any]) -> None:
        return None


@dataclass
class EvalOptions:
    """What to run. Categories 1-4 by default; ``max_questions`` caps questions per conversation;
    ``resume`` skips answers already in ``results.jsonl``; ``concurrency`` builds that many
    conversations' memories at once, then answers and judges that many questions at once;
    ``observer`` sees every unit of work and answer (default: none)."""

    systems: list[System] = field(default_factory=lambda: [SYSTEMS["nemori"], SYSTEMS["no-memory"]])
    categories: tuple[int, ...] = SCORED_CATEGORIES
    max_questions: int | None = None
    judge: bool = True
    progress: bool = True
    resume: bool = False
    concurrency: int = 1
    observer: RunObserver = field(default_factory=NullObserver)


class MemoryProvider(Protocol):
    """Gives each system the Memory its construction needs, and remembers which conversations are built."""

    def memory(self, system: System) -> Memory: ...

    def is_built(self, system: System, sample_id: str) -> bool: ...

    def mark_built(self, system: System, sample_id: str) -> None: ...


class SharedMemory:
    """One Memory for every system (tests, or runs whose systems share a construction); nothing reused."""

    def __init__(self, memory: Memory, records: Path | None = None) -> None:
        self._memory, self._built, self._records = memory, set(), records

    def record_path(self, system: System) -> Path | None:
        """Where stage calls are recorded while building (None: not recorded)."""
        return self._records

    def memory(self, system: System) -> Memory:
        return self._memory

    def is_built(self, system: System, sample_id: str) -> bool:
        return (system.construction_key(), sample_id) in self._built

    def mark_built(self, system: System, sample_id: str) -> None:
        self._built.add((system.construction_key(), sample_id))


# ---------------------------------------------------------------------------------------------- building
def ingest_conversation(memory: Memory, conv: LoCoMoConversation, progress: bool = True,
                        observer: RunObserver | None = None, system: str = "nemori") -> dict[str, Any]:
    """Add every turn (both speakers) as user ``conv.sample_id``, one window at a time, then one flush;
    each window (and the flush) runs inside ``observer.span`` (one trace per window when traced).

    Returns ``{"seconds", "parked": [...]}``.
    """
    observer = observer or NullObserver()
    w = memory.settings.window_size
    t0 = time.perf_counter()
    parked: list[str] = []
    bar = tqdm(total=len(conv.messages), desc=f"ingest {conv.sample_id}", unit="msg", disable=not progress)

    def show(stage: str) -> None:  # an LLM call finished: show which stage and how many so far
        bar.set_postfix_str(f"{stage}, {memory.usage.total().calls} LLM calls", refresh=True)

    memory.usage.listeners.append(show)
    try:
        for i in range(0, len(conv.messages), w):
            chunk = conv.messages[i:i + w]
            with observer.span(f"build {conv.sample_id} turns {i + 1}-{i + len(chunk)}", conversation=conv.sample_id,
                               system=system, turns=f"{i + 1}-{i + len(chunk)}"):
                res = memory.add_messages(conv.sample_id, chunk)
            parked += res.report.parked if res.report else []
            bar.update(len(chunk))
        with observer.span(f"build {conv.sample_id} flush", conversation=conv.sample_id, system=system, turns="flush"):
            parked += memory.flush(conv.sample_id).parked
    finally:
        memory.usage.listeners.remove(show)
        bar.close()
    return {"seconds": time.perf_counter() - t0, "parked": parked}


def episode_coverage(store: MemoryStore, user_id: str, message_ids: list[str]) -> dict[str, int]:
    """How many of ``message_ids`` sit in exactly one live episode, in none, or in several."""
    seen: dict[str, int] = {}
    episodes = store.list_episodes(user_id)
    for ep in episodes:
        for mid in ep.message_ids:
            seen[mid] = seen.get(mid, 0) + 1
    return {"messages": len(message_ids), "in_one_episode": sum(1 for m in message_ids if seen.get(m) == 1),
            "in_no_episode": sum(1 for m in message_ids if m not in seen),
            "in_several": sum(1 for m in message_ids if seen.get(m, 0) > 1), "episodes": len(episodes)}


def _build(provider: MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions) -> dict[str, Any]:
    """Build Nemori memory for every distinct construction among the systems; reuse what is built."""
    out: dict[str, Any] = {"seconds": 0.0, "parked": [], "coverage": {}, "reused": []}
    builders = {s.construction_key(): s for s in opts.systems if s.builds == "nemori"}
    lock = threading.Lock()
    for key, system in builders.items():
        memory = provider.memory(system)
        where = getattr(provider, "path", None)  # a store file to open with memory_quality inspect
        if where is not None and opts.progress:
            tqdm.write(f"{system.name}: memory store {where(system)}")

        def one(conv: LoCoMoConversation) -> None:
            if provider.is_built(system, conv.sample_id):
                out["reused"].append(f"{system.name}:{conv.sample_id}")
                if opts.progress:
                    tqdm.write(f"{system.name}:{conv.sample_id}: reusing memory built by an earlier run")
            else:
                record = getattr(provider, "record_path", None)  # tuning data beside the memory it describes
                with recording(record(system) if record else None):
                    ing = ingest_conversation(memory, conv, opts.progress and opts.concurrency == 1, opts.observer,
                                              system.name)
                with lock:  # conversations may be built in parallel threads
                    out["seconds"] += ing["seconds"]
                    out["parked"] += ing["parked"]
                if not ing["parked"]:
                    provider.mark_built(system, conv.sample_id)
            label = conv.sample_id if len(builders) == 1 else f"{system.name}:{conv.sample_id}"
            out["coverage"][label] = episode_coverage(memory.store, conv.sample_id, [m.id for m in conv.messages])

        if opts.concurrency <= 1:
            for conv in conversations:
                one(conv)
        else:  # each task runs in a copy of this context, so dspy.context(lm=...) overrides carry over
            with ThreadPoolExecutor(max_workers=opts.concurrency) as pool:
                futures = [pool.submit(contextvars.copy_context().run, one, conv) for conv in conversations]
                for f in futures:
                    f.result()
    from nemori_dspy.eval.memory_quality import memory_report  # what the built memory holds
    out["memory"] = memory_report(provider, conversations, opts.systems)
    return out


# --------------------------------------------------------------------------------------------- answering
def _memory_context(system: System, memory: Memory, conv: LoCoMoConversation, question: str):
    """Through ``ResponseGeneration.context``, the one answer-context path (library, eval, optimizers)."""
    ctx = memory.pipeline.response.context(conv.sample_id, question, include_episodes=system.include_episodes,
                                           include_semantic=system.include_semantic, include_raw=system.include_raw)
    episodes = ctx.retrieved.episodes
    return ctx.context, [sc.episode.message_ids for sc in episodes] if episodes else None, ctx.search_ms


def system_context(system: System, memory: Memory, conv: LoCoMoConversation, question: str, rag: RagIndex | None):
    """(context, ranked message ids per retrieved item or None, search ms) for one system."""
    budget = context_budget_chars(memory.settings.n_ctx)
    if system.context == "memory":
        return _memory_context(system, memory, conv, question)
    if system.context == "full":
        text, ids, truncated = full_context(conv.messages, budget, memory.settings.resolve_relative_dates)
        if truncated:
            tally("full_context_truncated")
        return text, [ids], 0.0
    if system.context == "rag" and rag is not None:
        t0 = time.perf_counter()
        chunks = rag.search(conv.sample_id, question, budget)
        return "\n\n".join(c.text for c in chunks), [c.ids for c in chunks], (time.perf_counter() - t0) * 1000
    return "", None, 0.0


class PreparedContext(NamedTuple):
    """What ``system_context`` returned for one (system, question): the context text, the ranked message ids per
    retrieved item (or None) and the retrieval time in ms; ``prepare_ms``: wall ms of the whole preparation
    (retrieval, fitting and rendering)."""

    context: str
    ranked: list[list[str]] | None
    search_ms: float
    prepare_ms: float = 0.0


def prepare_context(system: System, memory: Memory, conv: LoCoMoConversation, q: LoCoMoQuestion,
                    rag: RagIndex | None) -> PreparedContext:
    """``system_context`` for one question, its embedding calls charged to ``memory``'s usage ledger."""
    t0 = time.perf_counter()
    with memory.usage.charging():
        context, ranked, search_ms = system_context(system, memory, conv, q.question, rag)
    return PreparedContext(context, ranked, search_ms, (time.perf_counter() - t0) * 1000)


def context_tokens(context: str) -> int:
    """Tokens in the retrieved context (litellm's tokenizer), counted even when the answer call is a cache hit."""
    return litellm.token_counter(text=context) if context else 0


def recall_scores(ranked: list[list[str]] | None, evidence: list[str]) -> dict[str, float | None]:
    """Evidence recall@k, k in ``RECALL_KS``, as ``recall_at_<k>`` (None without evidence or retrieval)."""
    if ranked is None:
        return {f"recall_at_{k}": None for k in RECALL_KS}
    return {f"recall_at_{k}": evidence_recall_at_k(ranked, evidence, k) for k in RECALL_KS}


def _score(q: LoCoMoQuestion, answer: str, judge: LLMJudge | JudgePanel | None) -> dict[str, Any]:
    """Token F1, BLEU-1, LoCoMo F1 and one score per judge of the panel (``judge``, ``judge_strict``), with the
    judges' reasons under ``verdicts`` (``judge_verdicts``)."""
    scores: dict[str, Any] = {"f1": token_f1(answer, q.answer), "bleu1": bleu1(answer, q.answer),
                              "f1_locomo": f1_locomo(answer, q.answer, q.category)}
    panel = as_panel(judge)
    if panel is not None:
        scores.update(judge_verdicts(panel, dspy.Example(question=q.question, answer=q.answer), answer))
    return scores


def judge_verdicts(panel: JudgePanel, example: Any, answer: str) -> dict[str, Any]:
    """Every judge of ``panel`` on ``answer``: ``{<judge>: 1.0 | 0.0, ..., "verdicts": {<judge>: Verdict as a dict}}``
    (label, rationale, the strict judge's findings; what ``eval.tracking`` logs as assessments on the trace)."""
    verdicts = panel.assess(example, answer)
    return {**{name: v.score for name, v in verdicts.items()},
            "verdicts": {name: v.model_dump(exclude_defaults=True) for name, v in verdicts.items()}}


def _answer_row(system: System, memory: Memory, conv: LoCoMoConversation, q: LoCoMoQuestion,
                rag: RagIndex | None, judge: LLMJudge | JudgePanel | None,
                prepared: PreparedContext | None = None) -> dict[str, Any]:
    row, ranked = answer_question(system, memory, conv, q, rag, prepared)
    return {**row, **recall_scores(ranked, q.evidence), **_score(q, row["answer"], judge)}


def answer_question(system: System, memory: Memory, conv: LoCoMoConversation, q: LoCoMoQuestion,
                    rag: RagIndex | None, prepared: PreparedContext | None = None
                    ) -> tuple[dict[str, Any], list[list[str]] | None]:
    """One question answered by ``system`` (its context, then P_ans), unscored: (the answer row without scores, the
    ranked message ids of each retrieved item or None). An answer that fails is an empty answer (``answer_error``).
    ``prepared``: the context ``prepare_context`` already retrieved for this (system, question); ``total_ms`` is
    its ``prepare_ms`` plus the answer call either way."""
    if prepared is None:
        prepared = prepare_context(system, memory, conv, q, rag)
    t0 = time.perf_counter() - prepared.prepare_ms / 1000
    context, ranked, search_ms = prepared.context, prepared.ranked, prepared.search_ms
    failure = None
    with memory.usage.scope() as mine:
        try:
            answer = memory.pipeline(user_id=conv.sample_id, question=q.question, context=context).answer
        except RateLimitedError:  # no reply at all: asked again later (answer_tasks), never scored
            raise
        except LLMError as exc:  # one bad reply must not end the run: scored as an empty answer, counted, kept
            answer, failure = "", str(exc)
            tally("answers_failed")
            log.warning("%s %s#%s: no answer (%s); scored as an empty answer", system.name, q.sample_id, q.index, exc)
    usage = mine.total()
    total_ms = (time.perf_counter() - t0) * 1000
    return {"sample_id": q.sample_id, "index": q.index, "category": q.category,
            "category_name": CATEGORY_NAMES[q.category], "system": system.name, "question": q.question,
            "gold": q.answer, "answer": answer, "evidence": q.evidence, "context_chars": len(context),
            "context_tokens": context_tokens(context),
            "answer_input_tokens": usage.input_tokens, "answer_output_tokens": usage.output_tokens,
            "search_ms": round(search_ms, 1), "total_ms": round(total_ms, 1),
            **({"answer_error": failure} if failure else {})}, ranked


def answer_and_score(memory: Memory, conv: LoCoMoConversation, q: LoCoMoQuestion,
                     judge: LLMJudge | JudgePanel | None, system: System | None = None) -> dict[str, Any]:
    """One question answered through the eval's own path (``ResponseGeneration`` context → P_ans) and scored: the
    row ``results.jsonl`` holds (``answer``, ``f1``, ``bleu1``, ``f1_locomo``, ``judge`` when judged,
    ``recall_at_<k>``, ``context_tokens``, …). ``system`` defaults to ``nemori``. For benchmarks that build memory
    themselves (``benchmarks.construction --answer``); an answer that fails is scored empty (``answer_error``).

    Raises:
        RateLimitedError: the answer or a judge call was refused for rate limits (after litellm's retries).
    """
    return _answer_row(system or SYSTEMS["nemori"], memory, conv, q, None, judge)


def _row_key(row: dict[str, Any]) -> tuple[str, str, Any]:
    return row["system"], row["sample_id"], row["index"]


class _Checkpoint:
    """``results.jsonl`` written one row at a time (one ``write`` per line, flushed; thread-safe), read back on
    ``--resume``. A last line cut off by a kill is dropped (its question is asked again)."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path, self.lock = path, threading.Lock()
        self.rows = _read_rows(path) if resume and path.exists() else []
        if not resume or (path.exists() and len(self.rows) != _line_count(path)):
            self._write_all()  # a fresh file, or the resumed one without its torn last line
        self.done = {_row_key(r) for r in self.rows}

    def add(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=str) + "\n"
        with self.lock, self.path.open("a") as f:
            f.write(line)
            f.flush()
            self.rows.append(row)

    def order(self, keys: list[tuple[str, str, Any]]) -> None:
        """Put the rows in the order of ``keys`` (rows of other keys last, as they were) and rewrite the file
        so (atomically: a kill leaves the old file or the new one)."""
        rank = {k: i for i, k in enumerate(keys)}
        with self.lock:
            self.rows.sort(key=lambda r: rank.get(_row_key(r), len(rank)))  # stable: the rest keep their order
            self._write_all()

    def _write_all(self) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in self.rows))
        os.replace(tmp, self.path)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``results.jsonl``; a last line that does not parse (a kill mid-write) is dropped, logged."""
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i < len(lines) - 1:
                raise
            log.warning("%s: its last line is cut off (the run was killed while writing it); that question is "
                        "asked again", path)
    return rows


def answered_keys(path: Path) -> set[tuple[str, str, Any]]:
    """Keys ``(system, sample_id, index)`` of the rows in a ``results.jsonl`` (what ``--resume`` will skip); empty
    when the file does not exist."""
    return {_row_key(r) for r in _read_rows(path)} if path.exists() else set()


def _line_count(path: Path) -> int:
    return sum(1 for x in path.read_text().splitlines() if x.strip())


class AnswerTask(NamedTuple):
    """One question for one system: ``key`` = (system, sample id, index) as in ``results.jsonl``; ``span`` and
    ``tags`` name its unit of work for the observer; ``ask()`` answers, scores and returns the row (it may raise
    ``RateLimitedError``). ``order``: tasks are asked by increasing ``order`` (ties in list order), rows are kept
    in list order."""

    key: tuple[str, str, Any]
    span: str
    tags: dict[str, Any]
    ask: Callable[[], dict[str, Any]]
    order: tuple = ()


class _RateGate:
    """A pause shared by every answer thread: after a rate-limit refusal no question starts before it ends."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self._until, self._lock = stop, 0.0, threading.Lock()

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._until = max(self._until, time.monotonic() + seconds)

    def wait(self) -> bool:
        """Block until the pause is over; False if the run is stopping."""
        while True:
            with self._lock:
                left = self._until - time.monotonic()
            if left <= 0:
                return not self.stop.is_set()
            if self.stop.wait(left):
                return False


def _ask(task: AnswerTask, ckpt: "_Checkpoint", observer: RunObserver, gate: _RateGate,
         retries: int) -> dict[str, Any] | None:
    """``task.ask()`` inside the observer's span, its row checkpointed; after a rate-limit refusal every thread
    pauses (``_RateGate``) and the question is asked again, ``retries`` times at most. Returns the row, or None
    when the question was left unanswered (still refused, or the run is stopping)."""
    for attempt in range(retries + 1):
        if not gate.wait():
            return None
        try:
            with observer.span(task.span, **task.tags):
                row = task.ask()
                ckpt.add(row)
                with _OBSERVE_LOCK:  # inside the span: the tracker puts the verdicts on this answer's trace
                    observer.answered(row)
        except RateLimitedError as exc:
            if attempt == retries:
                tally("answers_rate_limited")
                log.warning("%s: refused for rate limits %d time(s); left unanswered (not scored): --resume asks "
                            "it again", task.span, attempt + 1)
                return None
            wait_s = max(exc.retry_after or 0.0, min(RATE_LIMIT_MAX_WAIT_S, RATE_LIMIT_WAIT_S * 2 ** attempt))
            tally("answer_rate_limit_pauses")
            log.warning("%s: refused for rate limits; every answer thread pauses %.0f s, then it is asked again "
                        "(%d of %d)", task.span, wait_s, attempt + 1, retries)
            gate.pause(wait_s)
            continue
        return row
    return None


def answer_tasks(tasks: list[AnswerTask], ckpt: "_Checkpoint", opts: EvalOptions, retries: int,
                 after_each: Callable[[dict[str, Any]], None] = lambda row: None, desc: str = "answer") -> float:
    """Ask every task whose key is not in ``ckpt.done``, ``opts.concurrency`` at a time, then order the rows.

    Each row is checkpointed as soon as it is scored and ``opts.observer.answered(row)`` is called, one thread at a
    time, inside the answer's span (by the thread that made it); ``after_each(row)`` runs in the calling thread. An exception in a task (or Ctrl-C / SIGTERM here) stops
    the run: no new question starts, the ones in flight finish and are checkpointed, then it propagates.
    Tasks are asked by their ``order`` (``locomo_tasks``: prompts that share a prefix one after another); when all
    are asked the checkpoint is put in the order of ``tasks`` (``_Checkpoint.order``).

    Args:
        tasks: every question of the run, in question order (answered ones included: they fix the order).
        retries: re-asks of a question refused for rate limits (the run's ``num_retries``).
    Returns:
        Wall seconds spent asking.
    """
    pending = sorted((t for t in tasks if t.key not in ckpt.done), key=lambda t: t.order)
    stop = threading.Event()
    gate = _RateGate(stop)
    bar = tqdm(total=len(pending), desc=desc, unit="q", disable=not opts.progress)
    t0 = time.perf_counter()

    def finished(row: dict[str, Any] | None) -> None:
        bar.update(1)
        if row is not None:
            after_each(row)

    try:
        if opts.concurrency <= 1 or len(pending) <= 1:
            for task in pending:
                finished(_ask(task, ckpt, opts.observer, gate, retries))
        else:
            _ask_in_threads(pending, ckpt, opts, gate, retries, finished)
    finally:
        stop.set()
        bar.close()
    seconds = time.perf_counter() - t0
    ckpt.order([t.key for t in tasks])  # after a kill the next --resume orders them
    return seconds


def _ask_in_threads(pending: list[AnswerTask], ckpt: "_Checkpoint", opts: EvalOptions, gate: _RateGate,
                    retries: int, finished: Callable[[dict[str, Any] | None], None]) -> None:
    pool = ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="nemori-answer")
    futures: set[Future] = set()
    try:  # each task runs in a copy of this context: dspy.context overrides and the run's ledgers carry over
        futures = {pool.submit(contextvars.copy_context().run, _ask, t, ckpt, opts.observer, gate, retries)
                   for t in pending}
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for f in done:
                finished(f.result())
    finally:
        gate.stop.set()  # tasks not started return at once; the ones in flight finish (their rows are kept)
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


class RunStart(NamedTuple):
    """What ``start_run`` hands the answering loop of an eval."""

    provider: "MemoryProvider"
    ckpt: "_Checkpoint"
    cost: "_CostCheckpoint"
    built: dict[str, Any]
    construction: dict[str, Usage]
    base: Memory
    rag: RagIndex | None
    skipped: int


def start_run(memories: "Memory | MemoryProvider", conversations: list[LoCoMoConversation], opts: EvalOptions,
              out_dir: Path, ledger: UsageLedger) -> RunStart:
    """The start every eval shares (LoCoMo, LongMemEval): open the answer and cost checkpoints, build (or
    reuse) memory, index the RAG baseline if a system needs it, report resumed answers.

    ``ledger`` is the run's own ``UsageLedger``, active (``ledger.charging()``) around the whole run: it
    is charged for the memories' calls and the judges', and is what ``cost.json`` and the tables report.
    """
    provider = SharedMemory(memories) if isinstance(memories, Memory) else memories
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = _Checkpoint(out_dir / "results.jsonl", opts.resume)
    cost = _CostCheckpoint(out_dir / "cost.json", opts.resume, ledger)
    built = _build(provider, conversations, opts)
    construction = ledger.snapshot()
    cost.save(construction, built)
    base = provider.memory(next((s for s in opts.systems if s.builds == "nemori"), opts.systems[0]))
    rag = None
    if any(s.context == "rag" for s in opts.systems):
        rag = RagIndex(base.embedder, resolve_dates=base.settings.resolve_relative_dates)
        for conv in conversations:
            rag.build(conv.sample_id, conv.messages)
    skipped = len(ckpt.done)
    if skipped and opts.progress:
        tqdm.write(f"resuming: {skipped} answers already in {ckpt.path}; only the rest are asked")
    return RunStart(provider, ckpt, cost, built, construction, base, rag, skipped)


def run_locomo(memories: Memory | MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions,
               judge: LLMJudge | JudgePanel | None, out_dir: Path) -> RunResult:
    """Build, answer, score; write ``results.jsonl`` (checkpointed), ``tables.md`` and ``summary.json``.

    Returns the run's ``RunResult``: per-(system, category) means, per-stage usage, coverage, parked work, tables.
    Usage is this run's alone (its own ``UsageLedger``), whatever else the process has run.
    """
    ledger = UsageLedger()
    with ledger.charging():
        return _run_locomo(memories, conversations, opts, judge, out_dir, ledger)


def locomo_tasks(provider: MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions,
                 rag: RagIndex | None, judge: LLMJudge | JudgePanel | None,
                 done: Collection[tuple[str, str, Any]] = ()) -> list[AnswerTask]:
    """Every (question, system) of a LoCoMo run in question order: conversation, its questions of
    ``opts.categories`` as ``stratified_questions`` picks them (``opts.max_questions``), then each system.

    Each task's context is retrieved here (``prepare_context``; the memory is built and no longer changes), and the
    tasks are asked conversation by conversation, system by system, in the order of their context texts
    (``AnswerTask.order``): prompts that share a prefix (the same top episodes) come one after another, so a server
    that keeps the previous prompt's state (llama.cpp's prefix reuse, a hosted API's prompt cache) prefills only
    where they differ. Interleaved with the no-memory control, every nemori prompt was prefilled whole. The answers
    are the same calls; rows stay in question order. Keys in ``done`` (answered before a ``--resume``) are listed
    without retrieving their context.
    """
    memories = {s.name: provider.memory(s) for s in opts.systems}  # resolved here, not in the answer threads
    tasks = []
    for c, conv in enumerate(conversations):
        for q in stratified_questions([q for q in conv.questions if q.category in opts.categories], opts.max_questions):
            for i, system in enumerate(opts.systems):
                key = (system.name, q.sample_id, q.index)
                prepared = (PreparedContext("", None, 0.0) if key in done
                            else prepare_context(system, memories[system.name], conv, q, rag))
                tasks.append(AnswerTask(
                    key, f"answer {q.sample_id}#{q.index} {system.name}",
                    {"conversation": q.sample_id, "question": q.index, "system": system.name, "category": q.category},
                    lambda s=system, c=conv, q=q, p=prepared: _answer_row(s, memories[s.name], c, q, rag, judge, p),
                    (c, i, prepared.context)))
    return tasks


def _run_locomo(memories: Memory | MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions,
                judge: LLMJudge | JudgePanel | None, out_dir: Path, ledger: UsageLedger) -> RunResult:
    provider, ckpt, cost, built, construction, base, rag, skipped = start_run(memories, conversations, opts, out_dir,
                                                                              ledger)
    tasks = locomo_tasks(provider, conversations, opts, rag, judge, ckpt.done)
    seconds = answer_tasks(tasks, ckpt, opts, base.settings.num_retries,
                           after_each=lambda row: cost.save(construction, built))
    construction, built = cost.carry_over(construction, built)
    return summarise(ckpt.rows, opts, judge, built, construction, skipped, out_dir, ledger,
                     local=base.settings.model == "local", answer_seconds=seconds)


def _add_usage(into: dict[str, dict[str, Any]], stages: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stage-wise sum of two usage maps (values: ``Usage`` or its ``model_dump()``)."""
    out = {k: dict(v) for k, v in into.items()}
    for name, u in stages.items():
        fields = u.model_dump() if isinstance(u, Usage) else u
        out[name] = Usage(**out.get(name, {})).add(Usage(**fields)).model_dump()
    return out


class _CostCheckpoint:
    """``cost.json`` in the run folder: the run's LLM/embedding usage so far, rewritten after memory
    construction and after every answer, so ``--resume`` after a kill still reports the whole run's cost
    (construction included). Without ``resume`` the earlier figures are ignored."""

    def __init__(self, path: Path, resume: bool, ledger: UsageLedger) -> None:
        self.path, self.ledger = path, ledger
        self.prev: dict[str, Any] = {}
        if resume and path.exists():
            try:
                self.prev = json.loads(path.read_text())
            except ValueError:
                log.warning("%s is not valid JSON: the resumed run reports only this invocation's cost", path)

    def _totals(self, construction: dict, built: dict[str, Any]) -> dict[str, Any]:
        p = self.prev
        counters = dict(p.get("counters", {}))
        for k, n in self.ledger.counters.items():
            counters[k] = counters.get(k, 0) + n
        emb = {k: p.get("embedding_usage", {}).get(k, 0) + v for k, v in self.ledger.embedding_summary().items()}
        return {"usage": _add_usage(p.get("usage", {}), self.ledger.snapshot()),
                "construction_usage": _add_usage(p.get("construction_usage", {}), construction),
                "counters": counters, "embedding_usage": emb,
                "ingest_seconds": float(p.get("ingest_seconds", 0.0)) + built["seconds"]}

    def save(self, construction: dict, built: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._totals(construction, built), indent=1))
        tmp.replace(self.path)  # atomic: a kill never leaves a half-written file

    def carry_over(self, construction: dict, built: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
        """Fold the earlier invocations' figures into the run's ledger and return merged construction/built."""
        if not self.prev:
            return construction, built
        totals = self._totals(construction, built)  # the same sums cost.json holds
        p = self.prev
        self.ledger.absorb(p.get("usage", {}), p.get("counters", {}), p.get("embedding_usage"))
        merged = {k: Usage(**v) for k, v in totals["construction_usage"].items()}
        return merged, {**built, "seconds": totals["ingest_seconds"]}


def summarise(rows: list[dict[str, Any]], opts: EvalOptions, judge: LLMJudge | JudgePanel | None,
               built: dict[str, Any], construction: dict, skipped: int, out_dir: Path, ledger: UsageLedger,
               local: bool = False,
               groups: list[Group] | None = None, scores: list[str] | None = None,
               answer_seconds: float = 0.0) -> RunResult:
    """Tables and ``summary.json``; runs the judge audit (``judge_audit.jsonl``) when the panel has pairs.

    ``groups`` are the table's row groups (default: LoCoMo categories 1-4, see ``metrics.LOCOMO_GROUPS``);
    ``scores`` the LLM-free answer scores shown after the judges' (default: token F1, BLEU-1, LoCoMo F1);
    usage, counters and the usage table are ``ledger``'s (the run's); ``answer_seconds``: wall seconds this
    invocation spent answering and judging (``answer_tasks``).
    """
    panel = as_panel(judge)
    judged = panel.metrics if panel else []
    plain = scores if scores is not None else [m for m in METRICS if m != "judge"]
    metrics = judged + plain + [f"recall_at_{k}" for k in RECALL_KS]
    systems = [s.name for s in opts.systems]
    audit = panel.run_audit(out_dir / "judge_audit.jsonl", opts.progress) if panel else None  # before the usage: it calls judges
    info = panel.info() if panel else {}
    result = RunResult(
        scores=_aggregate(rows, metrics, systems, groups),
        usage={k: v.model_dump() for k, v in ledger.snapshot().items()},
        construction_usage={k: v.model_dump() for k, v in construction.items()},
        embedding_usage=ledger.embedding_summary(),
        counters=dict(ledger.counters), coverage=built["coverage"], parked=built["parked"],
        reused_memory=built["reused"], ingest_seconds=round(built["seconds"], 1),
        answer_seconds=round(answer_seconds, 1), concurrency=opts.concurrency,
        resumed_answers=skipped, systems=systems,
        questions=len({(r["sample_id"], r["index"]) for r in rows}),
        judge=info.get("judge"), judges=info, judge_metrics=judged,
        judge_audit=audit,
        paired=paired_stats(rows, systems, groups=groups) if len(systems) > 1 else None,  # same questions, paired
        table=category_table(rows, metrics, systems, groups=groups), usage_table=ledger.table(local), rows=rows,
        groups=groups)
    result.paired_table = paired_table_from_stats(result.paired) if result.paired else None
    _write_tables(result, out_dir / "tables.md")
    result.stage_activity = _stage_activity(result, construction, out_dir / "tables.md")
    from nemori_dspy.eval.memory_quality import record_memory  # the Memory table

    result.memory = record_memory(built, out_dir / "tables.md")
    result.write(out_dir / "summary.json")
    return result


def _write_tables(result: RunResult, path: Path) -> None:
    """``tables.md``: scores, the judge audit and paired differences (when there are), usage per stage."""
    audit = result.judge_audit_dicts()
    md = f"## Judge audit (calibration set, ×100)\n\n```\n{audit_table(audit)}\n```\n\n" if audit else ""
    if result.paired:
        md += (f"## Paired differences vs {result.paired['baseline']} (×100, paired bootstrap 95% CI; judge: exact "
               f"McNemar p)\n\n```\n{result.paired_table}\n```\n\n")
    path.write_text(f"## Scores (×100, n per cell)\n\n```\n{result.table}\n```\n\n{md}"
                    f"## LLM usage per stage\n\n```\n{result.usage_table}\n```\n")


def _stage_activity(result: RunResult, construction: dict, tables_md: Path) -> dict[str, Any]:
    """Calls per stage and guard firings per 100 turns built and per episode; appended to ``tables_md``."""
    from nemori_dspy.eval.stage_activity import stage_activity, stage_activity_table

    cov = list(result.coverage.values())
    activity = stage_activity(construction, result.counters, sum(c.messages for c in cov),
                              sum(c.episodes for c in cov))
    with tables_md.open("a") as f:
        f.write(f"\n## Stage activity (construction)\n\n```\n{stage_activity_table(activity=activity)}\n```\n")
    return activity


def _aggregate(rows: list[dict[str, Any]], metrics: list[str], systems: list[str],
               groups: list[Group] | None = None) -> dict[str, dict[str, float]]:
    """``{system: {"<metric>.<group>": mean, "n.<group>": count}}`` over the groups and ``overall``."""
    out: dict[str, dict[str, float]] = {}
    for system in systems:
        for name, sel in scored_groups(rows, system, groups):
            for m in metrics:
                vals = [r[m] for r in sel if r.get(m) is not None]
                if vals:
                    out.setdefault(system, {})[f"{m}.{name}"] = sum(vals) / len(vals)
            out.setdefault(system, {})[f"n.{name}"] = len(sel)
    return out
