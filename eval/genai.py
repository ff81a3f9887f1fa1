"""The LoCoMo eval as MLflow GenAI evaluation, and the MLflow GenAI records every eval shares.

* ``question_records``: the questions an eval asks, as MLflow GenAI records (``inputs``: question, sample_id, index,
  category; ``expectations``: ``expected_response`` = the gold answer, ``evidence`` = its dialogue ids).
* ``slice_input``: those records as an ``mlflow.data`` dataset, logged as the runs' input (the slice that ran).
* ``verdict_feedbacks``: a judge's ``Verdict`` as MLflow assessments (``Feedback``): ``<judge>`` = ``yes``/``no``
  with the judge's reasoning as rationale and ``label`` = CORRECT/WRONG in its metadata, and for the strict judge
  ``judge_strict.key_facts_present`` / ``judge_strict.contradicts_gold``. ``eval.tracking`` logs them on each
  answer's trace; the scorers below return them.
* ``evaluate_locomo``: ``nemori-dspy eval locomo --genai``: memory is built as usual, then per system
  ``mlflow.genai.evaluate`` runs in that system's child run over a logged evaluation dataset
  (``mlflow.genai.datasets``), with ``predict_fn`` = the system's answer path and ``locomo_scorers``: our judges,
  token F1, LoCoMo F1, BLEU-1 and evidence recall@k. Its answer rows are the same as ``run_locomo``'s, so the
  summary, tables and the parent run's metrics are too.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import dspy

from nemori_dspy.errors import ConfigError
from nemori_dspy.eval.judge import JudgePanel, LLMJudge, as_panel
from nemori_dspy.eval.locomo import LoCoMoConversation, stratified_questions
from nemori_dspy.eval.metrics import bleu1, evidence_recall_at_k, f1_locomo, token_f1
from nemori_dspy.eval.runner import RECALL_KS, EvalOptions, MemoryProvider, answer_question, recall_scores, \
    start_run, summarise
from nemori_dspy.eval.summary import RunResult
from nemori_dspy.memory import Memory
from nemori_dspy.usage import UsageLedger

__all__ = ["question_records", "slice_input", "frame_input", "records_digest", "verdict_feedbacks", "gold_expectation",
           "locomo_scorers", "evaluation_dataset", "evaluate_locomo"]

_LLM_JUDGE, _CODE = "LLM_JUDGE", "CODE"


# ------------------------------------------------------------------------------------------------ the dataset
def question_records(conversations: list[LoCoMoConversation], categories: tuple[int, ...],
                     max_questions: int | None) -> list[dict[str, Any]]:
    """The questions ``run_locomo`` asks (same categories, same stratified cap per conversation, same order) as
    MLflow GenAI records ``{"inputs": {question, sample_id, index, category}, "expectations": {expected_response,
    evidence}}``."""
    out = []
    for conv in conversations:
        for q in stratified_questions([q for q in conv.questions if q.category in categories], max_questions):
            out.append({"inputs": {"question": q.question, "sample_id": q.sample_id, "index": q.index,
                                   "category": q.category},
                        "expectations": {"expected_response": str(q.answer), "evidence": list(q.evidence)}})
    return out


def records_digest(records: list[dict[str, Any]]) -> str:
    """sha256 (first 12 hex chars) of the records: names the evaluation dataset of exactly these questions."""
    return hashlib.sha256(json.dumps(records, sort_keys=True, default=str).encode()).hexdigest()[:12]


def slice_input(records: list[dict[str, Any]], name: str, source: str | Path) -> Any:
    """The records as an ``mlflow.data`` pandas dataset named ``name`` (one row per question: sample_id, index,
    category, question, answer, evidence), with the data file as its source and the gold answer as targets."""
    import pandas as pd

    df = pd.DataFrame([{**r["inputs"], "answer": r["expectations"]["expected_response"],
                        "evidence": json.dumps(r["expectations"]["evidence"])} for r in records])
    return frame_input(df, name, source)


def frame_input(df: Any, name: str, source: str | Path, targets: str = "answer") -> Any:
    """``mlflow.data.from_pandas(df)`` named ``name``, sourced at the data file ``source``, ``targets`` the gold
    column (MLflow's notes on how it read the source and on the inferred schema are silenced)."""
    import mlflow.data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mlflow.data.from_pandas(df, source=str(source), name=name, targets=targets)


def evaluation_dataset(records: list[dict[str, Any]], name: str, experiment_id: str,
                       tags: dict[str, str] | None = None) -> Any:
    """The MLflow GenAI evaluation dataset ``<name>-<records_digest>`` holding exactly ``records``: found by name if
    an earlier eval created it, else created in ``experiment_id`` with ``tags`` and filled."""
    from mlflow.exceptions import MlflowException
    from mlflow.genai import datasets

    full = f"{name}-{records_digest(records)}"
    try:
        return datasets.get_dataset(name=full)
    except MlflowException:
        pass
    ds = datasets.create_dataset(name=full, experiment_id=experiment_id, tags=tags)
    ds.merge_records(records)
    return ds


# ------------------------------------------------------------------------------------------------ assessments
def verdict_feedbacks(verdicts: dict[str, dict[str, Any]], models: dict[str, str] | None = None) -> list[Any]:
    """``{judge name: Verdict as a dict}`` (an answer row's ``verdicts``) → MLflow ``Feedback`` assessments:
    ``<judge>`` = ``"yes"`` (CORRECT) / ``"no"`` (WRONG), rationale = the judge's reasoning (the strict judge: its
    findings), metadata ``label`` (CORRECT/WRONG), ``overridden``, ``failed``; plus one boolean feedback per
    finding, ``<judge>.<finding>``. Source: ``LLM_JUDGE`` with ``models[name]`` (default: the judge's name)."""
    from mlflow.entities import AssessmentSource, Feedback

    out = []
    for name, v in verdicts.items():
        source = AssessmentSource(source_type=_LLM_JUDGE, source_id=(models or {}).get(name, name))
        findings = v.get("findings") or {}
        rationale = v.get("rationale") or (", ".join(f"{k}: {str(b).lower()}" for k, b in findings.items())
                                           + ("; CORRECT overridden to WRONG by the findings" if v.get("overridden")
                                              else "")) or None
        meta = {"label": v["label"], **{k: "true" for k in ("overridden", "failed") if v.get(k)}}
        out.append(Feedback(name=name, value="yes" if v["label"] == "CORRECT" else "no", rationale=rationale,
                            source=source, metadata=meta))
        out += [Feedback(name=f"{name}.{k}", value=bool(b), source=source) for k, b in findings.items()]
    return out


def gold_expectation(gold: str) -> Any:
    """The gold answer as an MLflow ``Expectation`` named ``expected_response`` (source: the dataset)."""
    from mlflow.entities import AssessmentSource, Expectation

    return Expectation(name="expected_response", value=str(gold),
                       source=AssessmentSource(source_type="HUMAN", source_id="locomo"))


# ------------------------------------------------------------------------------------------------ scorers
@contextmanager
def _caller_vars(caller: contextvars.Context) -> Iterator[None]:
    """Inside MLflow's worker threads: the context variables of the thread that started the evaluation (the run's
    usage ledger, DSPy overrides and callbacks) that this thread has not set itself (its trace stays its own)."""
    here = contextvars.copy_context()
    tokens = [(var, var.set(value)) for var, value in caller.items() if var not in here]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def locomo_scorers(panel: JudgePanel | LLMJudge | None, record: Callable[[dict, dict[str, Any]], None] | None = None,
                   caller: contextvars.Context | None = None) -> list[Any]:
    """MLflow scorers of a LoCoMo answer (``outputs``: ``{"answer", "retrieved"}``; ``expectations``:
    ``expected_response``, ``evidence``): one per judge of ``panel`` (feedbacks of ``verdict_feedbacks``), ``f1``,
    ``f1_locomo``, ``bleu1`` and ``recall_at_<k>`` (k in ``RECALL_KS``; None without evidence or retrieval).

    ``record(inputs, scores)``: called with every score a scorer computes (the eval's answer rows collect them);
    ``caller``: the context whose variables the scorers run with (default: this one).
    """
    caller = caller or contextvars.copy_context()
    note = record or (lambda inputs, scores: None)
    judges = as_panel(panel).judges if panel is not None else {}
    return [*(_judge_scorer(name, judge, note, caller) for name, judge in judges.items()),
            *(_text_scorer(metric, note) for metric in ("f1", "f1_locomo", "bleu1")),
            *(_recall_scorer(k, note) for k in RECALL_KS)]


def _judge_scorer(name: str, judge: Any, note: Callable, caller: contextvars.Context) -> Any:
    from mlflow.genai.scorers import scorer

    def judge_scorer(inputs: dict, outputs: dict, expectations: dict) -> list:
        with _caller_vars(caller), dspy.context(callbacks=[]):  # the judge's calls are not the answer's spans
            verdict = JudgePanel({name: judge}).assess(
                dspy.Example(question=inputs["question"], answer=expectations["expected_response"]),
                str(outputs.get("answer", "")))[name]
        note(inputs, {name: verdict.score, "verdicts": {name: verdict.model_dump(exclude_defaults=True)}})
        return verdict_feedbacks({name: verdict.model_dump()}, {name: str(getattr(judge, "model", name))})

    return scorer(judge_scorer, name=name)


def _text_scorer(metric: str, note: Callable) -> Any:
    from mlflow.entities import AssessmentSource, Feedback
    from mlflow.genai.scorers import scorer

    def text_scorer(inputs: dict, outputs: dict, expectations: dict) -> Any:
        answer, gold = str(outputs.get("answer", "")), str(expectations["expected_response"])
        value = {"f1": token_f1, "bleu1": bleu1}[metric](answer, gold) if metric != "f1_locomo" else \
            f1_locomo(answer, gold, int(inputs["category"]))
        note(inputs, {metric: value})
        return Feedback(name=metric, value=value, source=AssessmentSource(source_type=_CODE, source_id="nemori-dspy"))

    return scorer(text_scorer, name=metric)


def _recall_scorer(k: int, note: Callable) -> Any:
    from mlflow.entities import AssessmentSource, Feedback
    from mlflow.genai.scorers import scorer

    def recall_scorer(inputs: dict, outputs: dict, expectations: dict) -> Any:
        ranked = outputs.get("retrieved")
        value = None if ranked is None else evidence_recall_at_k(ranked, expectations.get("evidence") or [], k)
        note(inputs, {f"recall_at_{k}": value})
        return Feedback(name=f"recall_at_{k}", value=value,
                        source=AssessmentSource(source_type=_CODE, source_id="nemori-dspy"))

    return scorer(recall_scorer, name=f"recall_at_{k}")


# ------------------------------------------------------------------------------------------------ the eval
def evaluate_locomo(memories: Memory | MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions,
                    judge: LLMJudge | JudgePanel | None, out_dir: Path, system_runs: dict[str, str],
                    dataset_name: str = "locomo", experiment_id: str | None = None) -> RunResult:
    """LoCoMo through ``mlflow.genai.evaluate``: build (or reuse) memory as ``run_locomo`` does, then per system one
    evaluation in its MLflow run ``system_runs[system]`` (an ``EvalTracker``'s child runs), over the evaluation
    dataset of the questions (``evaluation_dataset``), with the system's answer path as ``predict_fn`` and
    ``locomo_scorers``. Every answer row (``results.jsonl``, ``opts.observer.answered``) is the one ``run_locomo``
    writes, with the scorers' scores; returns the same ``RunResult``.

    ``opts.concurrency``: also MLflow's evaluation worker threads (``MLFLOW_GENAI_EVAL_MAX_WORKERS``).
    Raises:
        ConfigError: ``opts.resume`` (an evaluation runs every question), or a system without a run id.
    """
    if opts.resume:
        raise ConfigError("--genai runs every question in one MLflow evaluation; it cannot resume. Fix: drop "
                          "--resume (or drop --genai to resume a run_locomo eval).")
    missing = [s.name for s in opts.systems if s.name not in system_runs]
    if missing:
        raise ConfigError(f"no MLflow run for system(s) {', '.join(missing)}. Fix: open the runs with EvalTracker.")
    ledger = UsageLedger()
    with ledger.charging():
        return _evaluate(memories, conversations, opts, as_panel(judge), out_dir, ledger, system_runs,
                         dataset_name, experiment_id)


def _evaluate(memories: Memory | MemoryProvider, conversations: list[LoCoMoConversation], opts: EvalOptions,
              panel: JudgePanel | None, out_dir: Path, ledger: UsageLedger, system_runs: dict[str, str],
              dataset_name: str, experiment_id: str | None) -> RunResult:
    import mlflow

    provider, ckpt, cost, built, construction, base, rag, skipped = start_run(memories, conversations, opts, out_dir,
                                                                              ledger)
    records = question_records(conversations, opts.categories, opts.max_questions)
    experiment_id = experiment_id or mlflow.get_run(next(iter(system_runs.values()))).info.experiment_id
    dataset = evaluation_dataset(records, dataset_name, experiment_id,
                                 tags={"benchmark": "locomo", "questions": str(len(records))})
    convs = {c.sample_id: c for c in conversations}
    questions = {(q.sample_id, q.index): q for c in conversations for q in c.questions}
    caller = contextvars.copy_context()
    with _eval_workers(opts.concurrency), _no_dspy_autolog():
        for system in opts.systems:
            rows: dict[tuple[str, int], dict[str, Any]] = {}
            lock = threading.Lock()

            def record(inputs: dict, scores: dict[str, Any], rows: dict = rows, lock: threading.Lock = lock) -> None:
                with lock:
                    row = rows.setdefault((inputs["sample_id"], int(inputs["index"])), {})
                    verdicts = {**row.get("verdicts", {}), **scores.get("verdicts", {})}
                    row.update(scores)
                    if verdicts:
                        row["verdicts"] = verdicts

            memory = provider.memory(system)

            def predict_fn(question: str, sample_id: str, index: int, category: int, system: Any = system,
                           memory: Memory = memory) -> dict[str, Any]:
                with _caller_vars(caller):
                    row, ranked = answer_question(system, memory, convs[sample_id], questions[(sample_id, int(index))],
                                                  rag)
                record({"sample_id": sample_id, "index": index}, {**row, **recall_scores(ranked, row["evidence"])})
                return {"answer": row["answer"], "retrieved": ranked}

            with mlflow.start_run(run_id=system_runs[system.name]):
                mlflow.genai.evaluate(data=dataset, predict_fn=predict_fn,
                                      scorers=locomo_scorers(panel, record, caller))
            for r in records:  # in question order, like run_locomo's results.jsonl
                row = rows.get((r["inputs"]["sample_id"], int(r["inputs"]["index"])))
                if row and "answer" in row:
                    ckpt.add(row)
                    opts.observer.answered(row)
            cost.save(construction, built)
    construction, built = cost.carry_over(construction, built)
    return summarise(ckpt.rows, opts, panel, built, construction, skipped, out_dir, ledger,
                     local=base.settings.model == "local")


@contextmanager
def _eval_workers(n: int) -> Iterator[None]:
    """``MLFLOW_GENAI_EVAL_MAX_WORKERS`` = ``n`` for the block (a value the user set wins)."""
    key = "MLFLOW_GENAI_EVAL_MAX_WORKERS"
    if key in os.environ:
        yield
        return
    os.environ[key] = str(max(1, n))
    try:
        yield
    finally:
        os.environ.pop(key, None)


@contextmanager
def _no_dspy_autolog() -> Iterator[None]:
    """``mlflow.genai.evaluate`` turns on every flavour's autolog tracing unless it was disabled: the DSPy one would
    add module spans beside ours (``eval.tracing.LMSpans``: one span per LM call, named after its stage). It stays
    disabled afterwards (``optimize``, the one user of DSPy autolog, turns it on itself)."""
    import mlflow

    try:
        mlflow.dspy.autolog(disable=True, silent=True)
    except (ImportError, AttributeError):  # no DSPy flavour: nothing to turn off
        pass
    yield
