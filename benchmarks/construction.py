"""Construction cost per stage per 100 turns on a LoCoMo slice: the paper-faithful configuration and each cost
switch, with evidence recall@k and answer coverage beside it, so no saving is bought with quality silently.

usage: python -m benchmarks.construction [--data FILE] [--sessions 1-1] [--conversations conv-26]
                                         [--lm scripted|local:0.5b|local:1.5b|<litellm model>] [--configs a,b]
                                         [--answer [--judge-model local:1.5b] [--max-questions N]]
                                         [--out benchmarks/results]

DSPy's response cache is off (a cached reply is not a call, so it would hide what is measured). Each
configuration builds every conversation of the slice in a fresh store (``eval.runner.ingest_conversation``,
the eval's own memory building) and is charged its own LLM calls, tokens and counters (its own ``UsageLedger``). Configurations
that change only the answer context (``answer_context_tokens``) reuse the stores of the configuration they
extend instead of building again. Per configuration it reports:

* calls and tokens (input + output) per 100 turns, in all and per stage, beside the cost targets;
* evidence recall@k (k = 10 by default): share of a question's gold evidence turns inside the top-k retrieved
  episodes (``eval.metrics.evidence_recall_at_k``) — what P_ans can see;
* answer coverage in memory: share of a gold answer's words found in the memory's narratives, cues and facts
  (raw messages left out: they always hold the answer); answer coverage in context: the same in the answer
  context ``ResponseGeneration.context`` renders, and that context's mean tokens.

With ``--answer`` every question of the slice (at most ``--max-questions`` per conversation, stratified by
category as ``eval locomo`` samples them: ``eval.locomo.stratified_questions``) is also answered through the eval's own path (``eval.runner.answer_and_score``: the configuration's answer context →
P_ans) and scored with token F1 and, with ``--judge-model``, the LLM judge; each configuration's judge, F1 and
evidence recall@k then get a mean with its 95% CI, side by side, and each row says whether its means lie inside
the CIs of the first configuration (the aim: the default within the paper-faithful configuration's CIs), and
each configuration is paired with the first on the questions both answered (the difference with its
paired bootstrap 95% CI and, for the judge, wins/losses and the exact McNemar p; ``eval.metrics.paired_stats``).
Targets are printed for people to read; nothing is asserted on timings. Writes
``<out>/construction-<lm>-<time>.json`` with the table, every figure, the settings of each configuration and the
machine description (``benchmarks.machine``).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.lm_runtime import SCRIPTED, lm_overrides, lm_runtime
from benchmarks.machine import describe_machine
from benchmarks.results_io import cli_description
from nemori_dspy.config import PAPER_FAITHFUL, NemoriSettings
from nemori_dspy.embedders import Embedder, HashingEmbedder, resolve_embedder
from nemori_dspy.eval.locomo import LoCoMoConversation, load_locomo, parse_sessions, slice_sessions, stratified_questions
from nemori_dspy.eval.metrics import evidence_recall_at_k, format_p, mean_ci95, paired_stats
from nemori_dspy.eval.runner import CONSTRUCTION_STAGES, answer_and_score, ingest_conversation
from nemori_dspy.formatting import count_tokens
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.usage import Usage, UsageLedger  # noqa: F401 (Usage: per-stage figures)

__all__ = ["CONFIGS", "TARGETS", "ConfigResult", "AnswerOptions", "run", "table", "score_table", "within", "spaced",
           "main", "answer_coverage", "pair_with_first", "paired_score_table"]

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "synthetic_locomo.json"

#: the cost targets: construction calls and tokens per 100 turns, answer context tokens.
TARGETS = {"calls_per_100": 35, "tokens_per_100": 30_000, "context_tokens": 2_000}

#: configuration name → (settings over PAPER_FAITHFUL, name of the configuration whose stores it reuses or None).
#: ``default`` is what ``NemoriSettings()`` ships; ``all`` turns on every switch.
CONFIGS: dict[str, tuple[dict[str, Any], str | None]] = {
    "paper": ({}, None),
    "similarity-floor": ({"consolidation_min_similarity": 0.5}, None),
    "consolidate-batched": ({"consolidation_min_similarity": 0.5, "consolidation_mode": "batched"}, None),
    "narrate-batched": ({"narration_mode": "batched"}, None),
    "partition-min-3": ({"partition_min_messages": 3}, None),
    "partition-chars-160": ({"partition_message_chars": 160}, None),
    "select-cues": ({"select_inputs": "cues"}, None),
    "anticipate-with-facts-only": ({"anticipate_without_facts": False}, None),
    "consolidate-across-episodes": ({"consolidate_within_episode": False}, None),
    "timestamps-on-change": ({"message_timestamps": "on_change"}, None),
    "window-40-held": ({"window_size": 40, "hold_open_segment": True}, None),
    "context-2000": ({"answer_context_tokens": 2000}, "paper"),
    "all": ({"consolidation_min_similarity": 0.5, "consolidation_mode": "batched", "narration_mode": "batched",
             "partition_min_messages": 3, "partition_message_chars": 160, "select_inputs": "cues",
             "anticipate_without_facts": False, "consolidate_within_episode": False,
             "message_timestamps": "on_change", "window_size": 40, "hold_open_segment": True}, None),
    "all+context-2000": ({"answer_context_tokens": 2000}, "all"),
    "default": (None, None),  # NemoriSettings() as shipped
}

#: ledger counters that show whether a switch worked or fell back (printed under the table).
SWITCH_COUNTERS = ("narrate_batch_fallback", "consolidation.batch_fallback", "consolidation.refused_targets",
                   "partition_skipped_short", "partition_fallback_whole_window", "parked_windows",
                   "parked_distillations", "answer_context_items_dropped", "retries", "segments_held",
                   "narrate_copied_line")

_WORD = re.compile(r"\w+")
_STOP = frozenset("a an the and or of in on at to for is was were be by with it its that this".split())


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def answer_coverage(gold: str, text_words: set[str]) -> float | None:
    """Share of the gold answer's words (lowercased, a few stopwords dropped) present in ``text_words``;
    None for a gold answer with no such word."""
    want = _words(str(gold))
    return len(want & text_words) / len(want) if want else None


@dataclass
class ConfigResult:
    """Figures of one configuration over the slice (``per_stage``: stage → {calls, tokens} per 100 turns)."""

    name: str
    turns: int
    questions: int
    calls_per_100: float
    tokens_per_100: float
    per_stage: dict[str, dict[str, float]]
    recall_at_k: float | None
    coverage_memory: float | None
    coverage_context: float | None
    context_tokens: float | None
    seconds: float
    parked: int
    settings: dict[str, Any]
    counters: dict[str, int]
    #: with ``--answer``: metric → [mean, low, high] (95% CI, ``eval.metrics.mean_ci95``) and n answered
    scores: dict[str, list[float]] = field(default_factory=dict)
    answered: int = 0
    answers_failed: int = 0
    #: with ``--answer``: one {sample_id, index, category, judge?, f1, recall_at_<k>} per answered question
    per_question: list[dict[str, Any]] = field(default_factory=list)
    #: with ``--answer``, every configuration but the first: metric → ``eval.metrics.paired_compare`` vs the first
    paired: dict[str, dict[str, Any]] = field(default_factory=dict)


def _settings(base: dict[str, Any], name: str) -> NemoriSettings:
    over, _ = CONFIGS[name]
    if over is None:
        return NemoriSettings(**base)
    return NemoriSettings(**{**base, **PAPER_FAITHFUL, **over})


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _quality(memory: Memory, conv: LoCoMoConversation, k: int) -> tuple[list, list, list, list]:
    """(recall@k, coverage in memory, coverage in context, context tokens) per question of ``conv``."""
    uid = conv.sample_id
    memory_words = _words(" ".join([*(f"{e.cue} {e.narrative}" for e in memory.list_episodes(uid)),
                                    *(e.text for e in memory.list_semantic(uid))]))
    recall, cov_mem, cov_ctx, tokens = [], [], [], []
    for q in conv.questions:
        ctx = memory.pipeline.response.context(uid, q.question)
        ranked = [s.episode.message_ids for s in ctx.retrieved.episodes]
        recall.append(evidence_recall_at_k(ranked, q.evidence, k) if ranked else 0.0)
        cov_mem.append(answer_coverage(q.answer, memory_words))
        cov_ctx.append(answer_coverage(q.answer, _words(ctx.context)))
        tokens.append(count_tokens(ctx.context))
    return recall, cov_mem, cov_ctx, tokens


def _per_100(stages: dict[str, Usage], turns: int) -> tuple[float, float, dict[str, dict[str, float]]]:
    scale = 100 / max(turns, 1)
    per = {name: {"calls": u.calls * scale, "tokens": (u.input_tokens + u.output_tokens) * scale}
           for name, u in stages.items() if u.calls}
    return (sum(p["calls"] for p in per.values()), sum(p["tokens"] for p in per.values()), per)


def spaced(items: list, n: int | None) -> list:
    """At most ``n`` of ``items``, evenly spaced (all of them when ``n`` is None or not smaller)."""
    if n is None or len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / max(n - 1, 1))] for i in range(n)] if n > 0 else []


def _answers(memory: Memory, conv: LoCoMoConversation, judge: Any, max_questions: int | None) -> list[dict]:
    """Rows of ``eval.runner.answer_and_score`` for the scored questions of ``conv`` (categories 1-4)."""
    from nemori_dspy.eval.locomo import SCORED_CATEGORIES

    qs = stratified_questions([q for q in conv.questions if q.category in SCORED_CATEGORIES], max_questions)
    return [answer_and_score(memory, conv, q, judge) for q in qs]


def _scores(rows: list[dict], k: int) -> dict[str, list[float]]:
    """metric → [mean, low, high] over ``rows`` for judge (when judged), F1 and recall@k (%)."""
    out = {}
    for metric in ("judge", "f1", f"recall_at_{k}"):
        vals = [float(r[metric]) for r in rows if r.get(metric) is not None]
        if vals:
            out[metric] = [100 * v for v in mean_ci95(vals)]
    return out


@dataclass
class AnswerOptions:
    """``--answer``: the judge (None = F1 and recall only) and the cap of questions per conversation."""

    judge: Any = None
    max_questions: int | None = None


def run_config(name: str, settings: NemoriSettings, embedder: Embedder, conversations: list[LoCoMoConversation],
               workdir: Path, stores: dict[str, Path], k: int = 10, answer: AnswerOptions | None = None) -> ConfigResult:
    """Build (or reuse) the slice's memories under ``settings`` and measure them (see the module docstring);
    with ``answer``, also answer and score the questions (answering is not charged to construction)."""
    _, reuse = CONFIGS.get(name, ({}, None))
    recall, cov_mem, cov_ctx, tokens, parked, rows = [], [], [], [], 0, []
    t0, mine = time.perf_counter(), UsageLedger()  # this configuration's own calls, tokens and counters
    for conv in conversations:
        key = f"{reuse or name}/{conv.sample_id}"
        path = stores.get(key) or workdir / name / f"{conv.sample_id}.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        memory = Memory(SQLiteStore(path), embedder, settings)
        with mine.charging():
            if key not in stores:
                parked += len(ingest_conversation(memory, conv, progress=False)["parked"])
                stores[key] = path
            r, m, c, t = _quality(memory, conv, k)
        recall, cov_mem, cov_ctx, tokens = recall + r, cov_mem + m, cov_ctx + c, tokens + t
        if answer is not None:
            rows += _answers(memory, conv, answer.judge, answer.max_questions)
    turns = sum(len(c.messages) for c in conversations)
    calls, toks, per = _per_100({s: u for s, u in mine.snapshot().items() if s in CONSTRUCTION_STAGES}, turns)
    return ConfigResult(name=name, turns=turns, questions=len(recall), calls_per_100=calls, tokens_per_100=toks,
                        per_stage=per, recall_at_k=_mean(recall), coverage_memory=_mean(cov_mem),
                        coverage_context=_mean(cov_ctx), context_tokens=_mean(tokens),
                        seconds=time.perf_counter() - t0, parked=parked,
                        settings={f: getattr(settings, f) for f in (*PAPER_FAITHFUL, "consolidation_min_similarity")},
                        counters={c: mine.counters[c] for c in SWITCH_COUNTERS if mine.counters.get(c, 0)},
                        scores=_scores(rows, k), answered=len(rows),
                        answers_failed=sum(1 for r in rows if r.get("answer_error")),
                        per_question=[_per_question(r, k) for r in rows])


def _per_question(row: dict[str, Any], k: int) -> dict[str, Any]:
    """The fields of an answer row that pairing needs (the question's id, category and scores)."""
    keys = ("sample_id", "index", "category", "judge", "f1", f"recall_at_{k}")
    return {key: row[key] for key in keys if key in row}


def pair_with_first(results: list[ConfigResult], k: int = 10) -> None:
    """Fill each result's ``paired`` (all but the first): per metric (judge, F1, recall@k) the paired difference
    against the first configuration on the questions both answered (``eval.metrics.paired_stats``; scores in
    [0, 1]). Results without answers are left empty."""
    if not results:
        return
    rows = [{**q, "system": r.name} for r in results for q in r.per_question]
    vs = paired_stats(rows, [r.name for r in results], metrics=["judge", "f1", f"recall_at_{k}"])["vs"]
    for r in results[1:]:
        r.paired = vs.get(r.name, {})


@contextmanager
def _lm(spec: str, base: dict[str, Any], judge: bool = False) -> Iterator[tuple[Embedder, str, Any]]:
    """Configure DSPy for ``spec`` ('scripted', 'local:<size>' or a litellm model); yields (embedder, label, judge):
    ``judge`` is an ``LLMJudge`` on ``base["judge_model"]`` (or the answer model) when asked for, else None."""
    from nemori_dspy.eval.judge import LLMJudge

    scripted = spec == SCRIPTED
    settings = NemoriSettings(**{**base, **lm_overrides(spec)})
    with lm_runtime(spec, settings) as rt:
        yield (HashingEmbedder(64) if scripted else resolve_embedder(settings), rt.model_label,
               LLMJudge(lm=rt.judge_lm, model_label=rt.judge_label) if judge else None)


def run(data: Path, sessions: str | None, conversations: list[str] | None, lm: str, configs: list[str],
        k: int = 10, base: dict[str, Any] | None = None, progress: bool = True,
        on_result: Callable[[list[ConfigResult], str], None] | None = None, answer: bool = False,
        judge: bool = False, max_questions: int | None = None) -> tuple[list[ConfigResult], str]:
    """Every configuration of ``configs`` on the slice; returns (results, LM label). ``on_result(results so
    far, label)`` is called after each configuration (``main`` writes the result file then, so a long real run
    stopped early keeps what it measured). ``answer``: also answer and score the questions (``judge``: with the
    LLM judge of ``base["judge_model"]``, else the answer model; ``max_questions`` per conversation).

    Raises:
        DatasetError: bad ``data``/``sessions``/``conversations`` (from ``eval.locomo``).
        ConfigError: an unknown configuration name (listed in the message).
    """
    from nemori_dspy.errors import ConfigError

    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ConfigError(f"unknown configuration(s) {unknown}. Fix: choose from {', '.join(CONFIGS)}.")
    base = {"cache": False, **(base or {})}  # a cache hit costs nothing: it would hide the calls being measured
    convs = [slice_sessions(c, parse_sessions(sessions)) for c in load_locomo(data, conversations)]
    needed = list(dict.fromkeys([CONFIGS[c][1] for c in configs if CONFIGS[c][1]] + configs))  # reused ones first
    results: list[ConfigResult] = []
    with ExitStack() as stack:
        embedder, label, llm_judge = stack.enter_context(_lm(lm, base, judge=answer and judge))
        answering = AnswerOptions(llm_judge, max_questions) if answer else None
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nemori-bench-")))
        stores: dict[str, Path] = {}
        done: dict[str, ConfigResult] = {}
        for name in needed:
            res = run_config(name, _settings(base, name), embedder, convs, workdir, stores, k, answering)
            reuse = CONFIGS[name][1]
            if reuse is not None:  # same memories: the construction cost is the one they were built with
                src = done[reuse]
                res.calls_per_100, res.tokens_per_100, res.per_stage = src.calls_per_100, src.tokens_per_100, src.per_stage
            done[name] = res
            if name in configs:
                results.append(res)
                pair_with_first(sorted(results, key=lambda r: configs.index(r.name)), k)
                if on_result is not None:
                    on_result(sorted(results, key=lambda r: configs.index(r.name)), label)
            if progress:
                print(f"{name}: {res.calls_per_100:.1f} calls, {res.tokens_per_100:,.0f} tokens per 100 turns "
                      f"({res.seconds:.0f}s)", flush=True)
    return sorted(results, key=lambda r: configs.index(r.name)), label


def _fmt(v: float | None, pattern: str) -> str:
    return "—" if v is None else format(v, pattern)


def table(results: list[ConfigResult], k: int = 10) -> str:
    """Markdown table: one row per configuration, totals and quality, then calls per stage."""
    head = (f"| configuration | calls / 100 turns (≤ {TARGETS['calls_per_100']}) | tokens / 100 turns "
            f"(≤ {TARGETS['tokens_per_100']:,}) | evidence recall@{k} | answer coverage, memory | "
            f"answer coverage, context | context tokens (≤ {TARGETS['context_tokens']:,}) | parked |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        lines.append(f"| {r.name} | {r.calls_per_100:.1f} | {r.tokens_per_100:,.0f} | {_fmt(r.recall_at_k, '.3f')} | "
                     f"{_fmt(r.coverage_memory, '.3f')} | {_fmt(r.coverage_context, '.3f')} | "
                     f"{_fmt(r.context_tokens, ',.0f')} | {r.parked} |")
    stages = [s for s in CONSTRUCTION_STAGES if any(s in r.per_stage for r in results)]
    lines += ["", "| configuration | " + " | ".join(f"{s} calls" for s in stages) + " |",
              "|" + "---|" * (len(stages) + 1)]
    for r in results:
        lines.append(f"| {r.name} | " + " | ".join(f"{r.per_stage.get(s, {}).get('calls', 0):.1f}" for s in stages)
                     + " |")
    lines += ["", f"turns {results[0].turns if results else 0}, questions {results[0].questions if results else 0}"]
    lines += [f"{r.name}: {', '.join(f'{k} {v}' for k, v in r.counters.items()) or 'no fallbacks or retries'}"
              for r in results]
    if any(r.scores for r in results):
        lines += ["", score_table(results, k)]
    if any(r.paired for r in results):
        lines += ["", paired_score_table(results)]
    return "\n".join(lines)


def _cell(ci: list[float] | None) -> str:
    return "—" if not ci else f"{ci[0]:.1f} [{ci[1]:.1f}–{ci[2]:.1f}]"


def within(ci: list[float] | None, ref: list[float] | None) -> bool | None:
    """True if the mean of ``ci`` lies inside the 95% CI of ``ref`` ([mean, low, high]); None if either is missing."""
    if not ci or not ref:
        return None
    return ref[1] <= ci[0] <= ref[2]


def score_table(results: list[ConfigResult], k: int = 10) -> str:
    """Judge, F1 and recall@k (%, mean [95% CI]) per configuration, side by side; the last column says whether
    each mean lies inside the first configuration's CI (the reference, e.g. ``paper``)."""
    metrics = ["judge", "f1", f"recall_at_{k}"]
    ref = results[0]
    head = ("| configuration | answered | " + " | ".join(metrics) + f" | means inside {ref.name}'s CIs |")
    lines = [head, "|" + "---|" * (len(metrics) + 3)]
    for r in results:
        flags = [within(r.scores.get(m), ref.scores.get(m)) for m in metrics]
        verdict = "—" if r is ref else ", ".join(f"{m} {'yes' if f else 'no' if f is not None else '—'}"
                                                 for m, f in zip(metrics, flags))
        lines.append(f"| {r.name} | {r.answered} ({r.answers_failed} failed) | "
                     + " | ".join(_cell(r.scores.get(m)) for m in metrics) + f" | {verdict} |")
    return "\n".join(lines)


def paired_score_table(results: list[ConfigResult]) -> str:
    """Markdown table of each configuration paired with the first (``ConfigResult.paired``, ×100): n, both means,
    the difference with its paired bootstrap 95% CI, and for the judge wins/losses and the exact McNemar p."""
    ref = results[0].name if results else ""
    lines = [f"paired with {ref} on the questions both answered (×100; B − A with its paired bootstrap 95% CI; "
             "judge: B wins / A wins and exact McNemar p)", "",
             "| configuration B | vs A | metric | n | A | B | B − A [95% CI] | B wins / A wins | McNemar p |",
             "|" + "---|" * 9]
    for r in results[1:]:
        for metric, s in r.paired.items():
            wl = f"{s['wins']} / {s['losses']}" if "wins" in s else "—"
            lines.append(f"| {r.name} | {ref} | {metric} | {s['n']} | {100 * s['mean_a']:.1f} | {100 * s['mean_b']:.1f} "
                         f"| {100 * s['diff']:+.1f} [{100 * s['low']:+.1f}, {100 * s['high']:+.1f}] | {wl} | "
                         f"{format_p(s.get('mcnemar_p')) if 'mcnemar_p' in s else '—'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format JSON (default: the synthetic one)")
    ap.add_argument("--sessions", default=None, help="LoCoMo slice, e.g. 1-3 (default: all sessions)")
    ap.add_argument("--conversations", default=None, help="comma-separated sample ids (default: all)")
    ap.add_argument("--lm", default="scripted", help="'scripted' (no model), 'local:0.5b', 'local:1.5b' or a litellm model")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from: {', '.join(CONFIGS)}")
    ap.add_argument("--k", type=int, default=10, help="k of evidence recall@k")
    ap.add_argument("--answer", action="store_true", help="also answer and score the questions (F1, recall, judge)")
    ap.add_argument("--judge-model", default=None, help="with --answer: the LLM judge (e.g. local:1.5b); "
                    "default: no judge, F1 and recall only")
    ap.add_argument("--max-questions", type=int, default=None, help="with --answer: at most N questions per "
                    "conversation, stratified by category (default: all)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args(argv)
    ids = [s.strip() for s in a.conversations.split(",")] if a.conversations else None
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"construction-{re.sub(r'[^A-Za-z0-9.]+', '_', a.lm)}-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def write(results: list[ConfigResult], label: str) -> str:
        text = table(results, a.k)
        path.write_text(json.dumps({
            "benchmark": "construction", "lm": a.lm, "model_label": label, "data": str(a.data),
            "sessions": a.sessions, "conversations": ids, "k": a.k, "targets": TARGETS,
            "answer": a.answer, "judge_model": a.judge_model, "max_questions": a.max_questions,
            "configs": configs, "complete": len(results) == len(configs),
            "seconds": round(time.perf_counter() - t0, 1), "results": [r.__dict__ for r in results],
            "table": text, "machine": describe_machine()}, indent=2, default=str))
        return text

    base = {"judge_model": a.judge_model} if a.judge_model else {}
    results, label = run(a.data, a.sessions, ids, a.lm, configs, a.k, base=base, on_result=write, answer=a.answer,
                         judge=a.answer and (a.judge_model is not None or a.lm == "scripted"),
                         max_questions=a.max_questions)
    print(write(results, label))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
