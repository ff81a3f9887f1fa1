"""Answer throughput: LoCoMo's 1,540 questions answered and judged in threads vs one at a time, scripted LM
sleeping 500 ms per call.

Memory is built first by the instant scripted LM (``nemori_dspy.testing.ScriptedLM``; not timed). Then the eval's own
answer path, ``run_locomo`` (retrieval, P_ans, the generous judge, the checkpoint and ``cost.json`` after every
answer, the summary), runs over that memory twice in this process: with ``--threads`` threads
(``--concurrency``), then sequentially. Every answer and judge call sleeps ``--delay`` seconds, standing in for a
hosted model's latency; everything else runs for real (adapter, hashing embedder, one SQLite store). The ratio says
how much of a hosted run's wall time threads take away. Target: the threaded run ≤ 15 min.

Sequential at 500 ms costs 1,540 × 2 × 0.5 s ≈ 26 min; ``--sequential-questions N`` runs it on a stratified sample
of about N questions instead (the figures then say so) and compares seconds per question.

Data: the repo's synthetic conversation (``tests/data/synthetic_mini.json``, 56 turns, 20 scored questions) scaled
to LoCoMo's size: 10 conversations whose three sessions repeat 10 times (dates 70 days apart: 560 turns each) and
whose 20 scored questions repeat, evidence moved to the repeat, to 154 each (1,540 in all); or LoCoMo itself with
``--data ../shared/data/locomo/locomo10.json`` (10 conversations, 5,882 turns, 1,540 scored questions).

usage: python -m benchmarks.answer_throughput [--data locomo10.json] [--threads 16] [--delay 0.5]
       [--sequential-questions N] [--scale 10 10 154]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import dspy

from benchmarks.parallel_construction import sleeping_lm
from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.adapters import make_adapter
from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.judge import LLMJudge
from nemori_dspy.eval.locomo import SCORED_CATEGORIES, LoCoMoConversation, load_locomo, normalise_evidence
from nemori_dspy.eval.runner import EvalOptions, SharedMemory, ingest_conversation, run_locomo
from nemori_dspy.eval.systems import SYSTEMS
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.testing import ScriptedLM, default_responders
from nemori_dspy.types import parse_timestamp

__all__ = ["TARGET_THREADED_S", "SYNTHETIC", "scaled_synthetic", "build_memory", "answer_run", "run", "main"]

TARGET_THREADED_S = 15 * 60.0
SYNTHETIC = Path(__file__).resolve().parents[1] / "tests/data/synthetic_mini.json"
_TIMING = ("search_ms", "total_ms")


def _moved(dia: str, repeat: int, sessions: int) -> str:
    """``D<session>:<turn>`` of the same turn in session repeat ``repeat``."""
    session, turn = dia[1:].split(":", 1)
    return f"D{int(session) + repeat * sessions}:{turn}"


def scaled_synthetic(path: Path, conversations: int = 10, repeats: int = 10, questions: int = 154,
                     source: Path = SYNTHETIC) -> Path:
    """Write ``source``'s first sample scaled up, in LoCoMo's schema, to ``path`` and return it: ``conversations``
    samples (``synth-01`` ...), each with the sessions repeated ``repeats`` times (70 days apart) and the scored
    questions (categories 1-4) repeated, evidence moved to their repeat, up to ``questions`` per sample."""
    sample = json.loads(source.read_text())[0]
    conv = sample["conversation"]
    numbers = sorted(int(k.split("_")[1]) for k in conv if k.startswith("session_") and k.count("_") == 1)
    scored = [q for q in sample["qa"] if q.get("category") in SCORED_CATEGORIES]
    out = []
    for c in range(conversations):
        scaled: dict[str, Any] = {"speaker_a": conv["speaker_a"], "speaker_b": conv["speaker_b"]}
        for r in range(repeats):
            for n in numbers:
                m = n + r * len(numbers)
                when = parse_timestamp(conv[f"session_{n}_date_time"]) + timedelta(days=70 * r)
                scaled[f"session_{m}_date_time"] = when.isoformat()
                scaled[f"session_{m}"] = [{**t, "dia_id": _moved(t["dia_id"], r, len(numbers))}
                                          for t in conv[f"session_{n}"]]
        qa = []
        for j in range(questions):
            q, r = scored[j % len(scored)], min(j // len(scored), repeats - 1)
            evidence = normalise_evidence(q.get("evidence", []))  # the file's quirky strings, as the loader reads them
            qa.append({**q, "evidence": [_moved(e, r, len(numbers)) for e in evidence]})
        out.append({"sample_id": f"synth-{c + 1:02d}", "conversation": scaled, "qa": qa})
    path.write_text(json.dumps(out))
    return path


def build_memory(conversations: list[LoCoMoConversation], folder: Path,
                 settings: NemoriSettings) -> tuple[SharedMemory, float]:
    """Every conversation's memory built by the instant scripted LM into ``folder/m.db``; returns the provider (all
    conversations marked built, so the runs reuse it) and the seconds it took."""
    mem = Memory(SQLiteStore(folder / "m.db"), HashingEmbedder(384), settings)
    provider = SharedMemory(mem)
    t0 = time.perf_counter()
    with dspy.context(lm=ScriptedLM(default_responders()), adapter=make_adapter(settings.adapter)):
        for conv in conversations:
            ingest_conversation(mem, conv, progress=False)
            provider.mark_built(SYSTEMS["nemori"], conv.sample_id)
    return provider, time.perf_counter() - t0


def answer_run(provider: SharedMemory, conversations: list[LoCoMoConversation], threads: int, delay: float,
               out: Path, max_questions: int | None = None) -> dict[str, Any]:
    """One ``run_locomo`` over the built memory (system ``nemori``, generous judge) with ``threads`` threads and an
    LM sleeping ``delay`` s per call; returns wall seconds, answer seconds, questions, LLM calls and the rows."""
    lm = sleeping_lm(delay)
    opts = EvalOptions(systems=[SYSTEMS["nemori"]], max_questions=max_questions, progress=False, concurrency=threads)
    settings = provider.memory(SYSTEMS["nemori"]).settings
    t0 = time.perf_counter()
    with dspy.context(lm=lm, adapter=make_adapter(settings.adapter)):
        result = run_locomo(provider, conversations, opts, LLMJudge(), out)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "answer_seconds": result.answer_seconds, "questions": len(result.rows),
            "lm_calls": sum(lm.calls.values()), "judge_overall": result.scores["nemori"].get("judge.overall"),
            "rows": result.rows}


def _same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """True if every row of ``b`` equals ``a``'s row of the same question, timings aside."""
    strip = lambda r: {k: v for k, v in r.items() if k not in _TIMING}  # noqa: E731
    mine = {(r["sample_id"], r["index"]): strip(r) for r in a}
    return all(mine.get((r["sample_id"], r["index"])) == strip(r) for r in b)


def run(data: Path | None, threads: int, delay: float, sequential_questions: int | None,
        scale: tuple[int, int, int] = (10, 10, 154)) -> dict[str, Any]:
    """Build, then the threaded run, then the sequential one (on a sample with ``sequential_questions``);
    ``scale`` = (conversations, repeats, questions each) of the synthetic data when ``data`` is None."""
    settings = NemoriSettings(cache=False, _env_file=None)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = data if data is not None else scaled_synthetic(folder / "scaled.json", *scale)
        conversations = load_locomo(path)
        provider, build_s = build_memory(conversations, folder, settings)
        par = answer_run(provider, conversations, threads, delay, folder / "threads")
        per_conv = None if sequential_questions is None else max(1, -(-sequential_questions // len(conversations)))
        seq = answer_run(provider, conversations, 1, delay, folder / "sequential", per_conv)
    par_q, seq_q = par["seconds"] / par["questions"], seq["seconds"] / seq["questions"]
    synthetic = f"synthetic_mini scaled ({scale[0]} conversations x {scale[1]} repeats, {scale[2]} questions each)"
    return {"data": str(data) if data else synthetic,
            "conversations": len(conversations), "turns": sum(len(c.messages) for c in conversations),
            "build_s": build_s, "threads": threads, "delay_s": delay,
            "threaded": {k: v for k, v in par.items() if k != "rows"},
            "sequential": {k: v for k, v in seq.items() if k != "rows"},
            "sequential_sampled": seq["questions"] < par["questions"],
            "speedup": seq_q / par_q, "ideal_speedup": float(threads),
            "same_rows": _same_rows(par["rows"], seq["rows"]), "target_threaded_s": TARGET_THREADED_S,
            "meets_target": par["seconds"] <= TARGET_THREADED_S}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table, write ``results/answer_throughput.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--data", type=Path, help="a LoCoMo file (default: the synthetic conversation scaled up)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--delay", type=float, default=0.5, help="seconds the scripted LM sleeps per call")
    ap.add_argument("--sequential-questions", type=int, default=None,
                    help="run the sequential pass on about this many questions (stratified per conversation); "
                         "default: all of them")
    ap.add_argument("--scale", type=int, nargs=3, default=[10, 10, 154], metavar=("CONVERSATIONS", "REPEATS", "QUESTIONS"),
                    help="synthetic data: conversations, session repeats, questions each (default 10 10 154)")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    f = run(a.data, a.threads, a.delay, a.sequential_questions, tuple(a.scale))
    par, seq = f["threaded"], f["sequential"]
    sample = " (sample)" if f["sequential_sampled"] else ""
    print(table(["measure", "figure", "target"], [
        ["conversations, turns", f"{f['conversations']}, {f['turns']:,}", ""],
        ["memory built by the instant scripted LM (s)", f"{f['build_s']:.1f}", ""],
        ["LLM calls: answer + judge, each sleeping %.0f ms" % (1000 * a.delay),
         f"{par['lm_calls']:,} threaded, {seq['lm_calls']:,} sequential{sample}", ""],
        [f"{a.threads} threads: {par['questions']:,} questions (min)", f"{par['seconds'] / 60:.1f}",
         f"<= {TARGET_THREADED_S / 60:.0f}"],
        [f"sequential: {seq['questions']:,} questions{sample} (min)", f"{seq['seconds'] / 60:.1f}", ""],
        ["seconds per question, threaded / sequential",
         f"{par['seconds'] / par['questions']:.3f} / {seq['seconds'] / seq['questions']:.3f}", ""],
        ["ratio (sequential / threaded, per question)", f"{f['speedup']:.1f}x", f"ideal {a.threads}x"],
        ["same answers and verdicts in both runs", "yes" if f["same_rows"] else "NO", "yes"]]))
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    print(f"written {write_result('answer_throughput', params, f, a.out_dir)}")
    return f


if __name__ == "__main__":
    main()
