"""What MLflow tracing of an eval costs: seconds per 1,000 LLM calls, scripted LM, temporary sqlite store.

usage: python -m benchmarks.tracing_cost [--calls 500] [--per-trace 10]

The same ``calls`` answer-stage calls (``StagePredict`` over the scripted LM, DSPy's cache off) run once
without tracing and once with ``eval.tracing`` (one ``LMSpans`` span per call, one ``trace_group`` root per
``per-trace`` calls, as an eval groups a construction window), then the async trace export is flushed and
counted. Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import dspy

from benchmarks.results_io import cli_description
from nemori_dspy.predict import StagePredict
from nemori_dspy.signatures import SIGNATURES
from nemori_dspy.testing import ScriptedLM, default_responders


def _calls(n: int, per_trace: int, group: object | None) -> float:
    stage = StagePredict(SIGNATURES["answer"], "answer")
    t0 = time.perf_counter()
    for start in range(0, n, per_trace):
        ctx = group(f"bench {start}") if group else None
        if ctx:
            ctx.__enter__()
        try:
            for i in range(start, min(n, start + per_trace)):
                stage(context=f"memory {i}", question=f"question {i}?")
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
    return time.perf_counter() - t0


def run(calls: int, per_trace: int) -> dict[str, float]:
    """Seconds for ``calls`` calls without and with tracing; tracing seconds include the export flush."""
    import mlflow

    from nemori_dspy.eval.tracing import LMSpans, trace_group

    lm = ScriptedLM(default_responders())
    dspy.configure(lm=lm, adapter=dspy.ChatAdapter())
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    _calls(20, per_trace, None)  # warm-up: imports, adapter
    plain = _calls(calls, per_trace, None)
    with tempfile.TemporaryDirectory() as tmp:
        mlflow.set_tracking_uri(f"sqlite:///{Path(tmp)}/bench.db")
        exp = mlflow.create_experiment("bench", artifact_location=(Path(tmp) / "art").as_uri())
        mlflow.set_experiment(experiment_id=exp)
        warm_id = mlflow.MlflowClient().create_run(exp).info.run_id
        with dspy.context(callbacks=[LMSpans(warm_id)]):
            _calls(20, per_trace, lambda name: trace_group(name, warm_id))
            mlflow.flush_trace_async_logging()
        run_id = mlflow.MlflowClient().create_run(exp).info.run_id
        with dspy.context(callbacks=[LMSpans(run_id)]):
            t0 = time.perf_counter()
            traced = _calls(calls, per_trace, lambda name: trace_group(name, run_id))
            mlflow.flush_trace_async_logging()
            traced_all = time.perf_counter() - t0
        spans = sum(len(t.data.spans) for t in mlflow.search_traces(run_id=run_id, return_type="list",
                                                                     max_results=10_000))
    return {"plain": plain, "traced": traced, "traced_all": traced_all, "spans": spans}


def main() -> None:
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--per-trace", type=int, default=10)
    a = ap.parse_args()
    r = run(a.calls, a.per_trace)

    def per_k(seconds: float) -> float:
        return 1000 * seconds / a.calls

    print(f"{a.calls} answer calls, scripted LM, one trace per {a.per_trace} calls ({r['spans']:.0f} spans stored)")
    print(f"{'':<34}{'s total':>10}{'s / 1,000 calls':>18}")
    print(f"{'no tracing':<34}{r['plain']:>10.2f}{per_k(r['plain']):>18.2f}")
    print(f"{'tracing (in the calls)':<34}{r['traced']:>10.2f}{per_k(r['traced']):>18.2f}")
    print(f"{'tracing (incl. export flush)':<34}{r['traced_all']:>10.2f}{per_k(r['traced_all']):>18.2f}")
    print(f"{'cost of tracing':<34}{r['traced_all'] - r['plain']:>10.2f}{per_k(r['traced_all'] - r['plain']):>18.2f}")


if __name__ == "__main__":
    main()
