"""MLflow record of an eval, live while it runs: one parent run, one child run per system.

``EvalTracker`` opens the parent (params: resolved config without secrets, dataset checksum, slice, models,
server flags, and per stage the hash and prompt-registry version of the prompt that runs) and a child per
system as soon as the model is up. While the eval runs, every answer is logged as produced: a row of the
``answers.json`` table (``mlflow.log_table``; the first 20 rows one by one, then at most every 10 s) and step
metrics (``progress.answers``, ``running.<system>.<metric>`` on the parent, ``running.<metric>`` on the child,
step = answers of that system so far), and every LLM call is a trace span (``eval/tracing.py``); each answer's trace
gets its gold answer and judge verdicts as assessments (``eval.genai.verdict_feedbacks``). The questions that run are
the runs' input (``log_input``: an ``mlflow.data`` dataset). At the end: final metrics (``<system>.<metric>`` on the
parent, ``<metric>`` without the prefix on each system's child), artifacts (run folder, charts, ``prompts.json``
with the texts that ran), the program as an ``mlflow.dspy`` model (``eval/model.py``), the ``@latest-eval`` prompt
aliases, status FINISHED.

A run killed by Ctrl-C / SIGTERM ends KILLED, one that raised ends FAILED (also at interpreter exit, by an
``atexit`` hook). A ``kill -9`` leaves it RUNNING: the next tracker start in this experiment marks every
RUNNING run whose recorded process (tags ``nemori.host``, ``nemori.pid``) is gone as KILLED, and ``--resume``
reopens the same runs (ids kept in ``<run folder>/mlflow_run.json``) and finishes them.

Prompt lineage: ``stage_prompts(pipeline)`` is the text of each stage's predictor *as loaded* (instruction, field
prefixes/descriptions, demos: ``predictor_text``); ``prompt.<stage>`` is its hash and ``prompt_version.<stage>`` the
version of ``nemori-dspy-<stage>`` in the prompt registry holding exactly that text (a tuned program registers a
new version; an unchanged one finds its version). ``optimize`` registers tuned text through the same functions
(alias ``@tuned``); ``load_stage_prompt`` reads one back by alias or version (``--program prompts:/<name>@<alias>``).

Tracking URI: ``settings.mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns.db``
(the sqlite backend needs full ``mlflow``, not ``mlflow-skinny``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import socket
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

from nemori_dspy.config import NemoriSettings
from nemori_dspy.eval.summary import RunResult, RunSummary

__all__ = ["tracking_uri", "artifact_location", "flatten", "predictor_text", "stage_prompts", "prompt_hash",
           "register_prompt", "register_prompts", "set_prompt_aliases", "load_stage_prompt", "prompt_name",
           "EVAL_ALIAS", "TUNED_ALIAS", "PROMPT_PREFIX", "mark_stale_runs", "process_tags", "EvalTracker", "RUN_FILE",
           "log_eval_run", "set_experiment"]

log = logging.getLogger(__name__)

#: in the run folder: the MLflow run ids of this eval, so ``--resume`` continues the same runs.
RUN_FILE = "mlflow_run.json"
_EAGER_ROWS, _ROW_EVERY_S = 20, 10.0
_PARENT_TAG = "mlflow.parentRunId"


def tracking_uri(settings: NemoriSettings) -> str:
    """The MLflow tracking URI this run uses."""
    return settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns.db"


def artifact_location(uri: str) -> str | None:
    """For a ``sqlite:///<dir>/x.db`` tracking URI, ``file://<dir>/mlruns``: artifacts live beside the
    database instead of in whatever folder the process runs from. None for other URIs (server default)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()


def set_experiment(mlflow: Any, uri: str, name: str) -> str:
    """Make ``name`` the active experiment, creating it with ``artifact_location(uri)`` if new; returns its id."""
    if mlflow.get_experiment_by_name(name) is None:
        mlflow.create_experiment(name, artifact_location=artifact_location(uri))
    return mlflow.set_experiment(name).experiment_id


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dict → ``{"a.b": "value"}`` with values as short strings (MLflow params)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


# ------------------------------------------------------------------------------------------- prompt lineage
def predictor_text(state: dict[str, Any]) -> str:
    """The prompt-defining text of one saved predictor state: its instruction, fields and demos (JSON)."""
    sig = state.get("signature", {})
    return json.dumps({"instructions": sig.get("instructions"), "fields": sig.get("fields"),
                       "demos": state.get("demos", [])}, sort_keys=True, default=str)


def stage_prompts(module: Any) -> dict[str, str]:
    """``{stage: text}`` of the prompts a pipeline (or ``eval.model.ProgramModel``) runs: for a stage with one
    predictor its ``predictor_text``, for one with several (e.g. ChainOfThought inside StagePredict) a JSON map
    of them. Stages come from ``nemori_dspy.stages.PIPELINE_PATHS``."""
    from nemori_dspy.stages import PIPELINE_PATHS

    state = module.dump_state()
    out: dict[str, str] = {}
    for stage, path in PIPELINE_PATHS.items():
        mine = {k[len(path) + 1:]: predictor_text(v) for k, v in state.items() if k.startswith(path + ".")}
        if mine:
            out[stage] = next(iter(mine.values())) if len(mine) == 1 else json.dumps(mine, sort_keys=True)
    return out


def prompt_hash(text: str) -> str:
    """sha256 (first 12 hex chars) of a stage's prompt text."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: prompt-registry alias a finished eval moves to the stage prompts it ran; ``optimize`` sets ``TUNED_ALIAS``.
EVAL_ALIAS = "latest-eval"
#: prompt-registry alias ``optimize`` sets on the prompts it tuned (``optimizers.tracking``).
TUNED_ALIAS = "tuned"
#: prefix of the registered stage prompts: ``nemori-dspy-<stage>``.
PROMPT_PREFIX = "nemori-dspy"


def prompt_name(stage: str, prefix: str = PROMPT_PREFIX) -> str:
    """The registry name of a stage's prompt: ``nemori-dspy-<stage>`` with ``_`` and ``+`` as ``-``."""
    return f"{prefix}-{stage.replace('_', '-').replace('+', '-')}"


def register_prompt(stage: str, text: str, message: str, prefix: str = PROMPT_PREFIX,
                    tags: dict[str, str] | None = None, alias: str | None = None) -> int:
    """The version of ``<prefix>-<stage>`` holding exactly ``text`` (the newest such), registering ``text`` as a new
    version when none does: a tuned prompt gets a new version, a prompt that ran before keeps its version.

    ``alias`` (e.g. :data:`TUNED_ALIAS`): also point that alias of the prompt at the version (``prompts:/<name>@<alias>``
    then loads it). A new version is tagged with its ``hash`` and ``stage``.
    Returns the version number. Needs a backend with a prompt registry (sqlite/postgres/server);
    raises ``mlflow.exceptions.MlflowException`` otherwise.
    """
    import mlflow

    name = prompt_name(stage, prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        version = _version_holding(name, text)
        if version is None:
            version = int(mlflow.genai.register_prompt(
                name=name, template=text, commit_message=message,
                tags={"hash": prompt_hash(text), "stage": stage, **(tags or {})}).version)
        if alias:
            mlflow.genai.set_prompt_alias(name, alias, version)
    return version


def _version_holding(name: str, text: str) -> int | None:
    """The newest version of prompt ``name`` whose template is ``text``; None when none is."""
    import mlflow

    latest = mlflow.genai.load_prompt(f"prompts:/{name}@latest", allow_missing=True)
    for version in range(int(latest.version) if latest is not None else 0, 0, -1):
        cur = latest if version == int(latest.version) else \
            mlflow.genai.load_prompt(f"prompts:/{name}/{version}", allow_missing=True)
        if cur is not None and cur.template == text:
            return version
    return None


def register_prompts(prompts: dict[str, str], prefix: str = PROMPT_PREFIX, alias: str | None = None) -> dict[str, int]:
    """:func:`register_prompt` for every ``{stage: text}`` (each pointed to by ``alias`` if given);
    returns ``{stage: version}``."""
    return {stage: register_prompt(stage, text, f"prompt hash {prompt_hash(text)}", prefix, alias=alias)
            for stage, text in prompts.items()}


def set_prompt_aliases(versions: dict[str, int], alias: str, prefix: str = PROMPT_PREFIX) -> None:
    """Point ``alias`` of each stage's prompt at its version (``{stage: version}``, from :func:`register_prompts`)."""
    import mlflow

    for stage, version in versions.items():
        mlflow.genai.set_prompt_alias(prompt_name(stage, prefix), alias, int(version))


def load_stage_prompt(uri: str, prefix: str = PROMPT_PREFIX) -> tuple[str, str, int]:
    """``prompts:/<name>@<alias>`` or ``prompts:/<name>/<version>`` → (stage, text, version) from the prompt registry
    of MLflow's current tracking URI. The stage is the prompt's ``stage`` tag, else the stage whose
    :func:`prompt_name` is ``<name>``.

    Raises:
        ConfigError: no such prompt, alias or version, or the name is no stage's.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    from nemori_dspy.errors import ConfigError
    from nemori_dspy.stages import PIPELINE_PATHS

    fix = (f"Fix: name a registered stage prompt, e.g. prompts:/{prompt_name('answer', prefix)}@{EVAL_ALIAS} "
           f"(aliases: {EVAL_ALIAS} after an eval, {TUNED_ALIAS} after optimize) or prompts:/<name>/<version>; "
           "pass --mlflow-tracking-uri if it lives in another store.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prompt = mlflow.genai.load_prompt(uri)
    except MlflowException as exc:
        raise ConfigError(f"--program {uri}: cannot load the prompt ({str(exc).splitlines()[0][:200]}). {fix}") from None
    stage = (prompt.tags or {}).get("stage") or next(
        (s for s in PIPELINE_PATHS if prompt_name(s, prefix) == prompt.name), None)
    if stage not in PIPELINE_PATHS:
        raise ConfigError(f"--program {uri}: prompt {prompt.name!r} is no pipeline stage's. {fix}")
    return stage, prompt.template, int(prompt.version)


# ------------------------------------------------------------------------------------------------ live runs
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def process_tags() -> dict[str, str]:
    """``{"nemori.host", "nemori.pid"}`` of this process: how ``mark_stale_runs`` tells a dead run."""
    return {"nemori.host": socket.gethostname(), "nemori.pid": str(os.getpid())}


def mark_stale_runs(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED every RUNNING run of the experiment whose process (tags ``nemori.host`` = this host,
    ``nemori.pid``) no longer exists, e.g. after ``kill -9``. Runs of other hosts are left alone.
    Returns the ids marked."""
    host, marked = socket.gethostname(), []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=500):
        tags = run.data.tags
        pid = tags.get("nemori.pid")
        if tags.get("nemori.host") == host and pid and pid.isdigit() and int(pid) != os.getpid() \
                and not _alive(int(pid)):
            client.set_terminated(run.info.run_id, status="KILLED")
            marked.append(run.info.run_id)
    return marked


class EvalTracker:
    """The live MLflow record of one eval (see the module docstring); also the runner's ``RunObserver``.

    Args:
        settings: the run's settings (tracking URI, experiment, tracing on/off).
        out_dir: the run folder (``mlflow_run.json`` lives there; its files are logged at the end).
        systems: system names (one child run each).
        run_name: the parent's name (the run folder's name).
        resume: reopen the runs recorded in ``out_dir/mlflow_run.json`` if they exist.
    Use as a context manager around the eval: leaving it by an exception ends the runs FAILED (KILLED for
    Ctrl-C / SIGTERM) unless ``finish`` was called.
    """

    def __init__(self, settings: NemoriSettings, out_dir: Path, systems: list[str], run_name: str,
                 resume: bool = False) -> None:
        self.settings, self.out_dir, self.systems, self.run_name = settings, Path(out_dir), systems, run_name
        self.resume, self.uri = resume, tracking_uri(settings)
        self.parent: str | None = None
        self.children: dict[str, str] = {}
        self.client: Any = None
        self.resumed = False
        # log_table appends by downloading the table first: without this every answer draws MLflow's
        # "Downloading artifacts" bars over the eval's own progress bar (a user's setting still wins)
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._logged_rows, self._last_flush = 0, 0.0
        self._sums: dict[str, dict[str, list[float]]] = {}
        self._answers = 0
        self._closed = False
        self._spans: Any = None
        #: judge name → judge model, the source of the verdict assessments (default: the judge's name)
        self.judge_models: dict[str, str] = {}
        self._prompts: dict[str, str] = {}
        self._versions: dict[str, int] = {}  # {stage: prompt-registry version} of the prompts that run

    # ------------------------------------------------------------------ start
    def start(self, params: dict[str, Any], prompts: dict[str, str] | None = None) -> str:
        """Open (or, on resume, reopen) the parent and child runs and log ``params`` and the prompt lineage
        of ``prompts`` (``stage_prompts`` of the pipeline that runs). Returns the parent run id."""
        import mlflow
        from mlflow.tracking import MlflowClient

        mlflow.set_tracking_uri(self.uri)
        exp_id = set_experiment(mlflow, self.uri, self.settings.mlflow_experiment)
        self.client = MlflowClient(tracking_uri=self.uri)
        for run_id in mark_stale_runs(self.client, exp_id):
            log.warning("MLflow run %s was left RUNNING by a process that is gone: marked KILLED", run_id)
        tags = process_tags()
        if not self._reopen(tags):
            self.parent = self.client.create_run(exp_id, run_name=self.run_name, tags=tags).info.run_id
            self.children = {s: self.client.create_run(exp_id, run_name=s, tags={**tags, _PARENT_TAG: self.parent})
                             .info.run_id for s in self.systems}
            (self.out_dir / RUN_FILE).parent.mkdir(parents=True, exist_ok=True)
            (self.out_dir / RUN_FILE).write_text(json.dumps({"parent": self.parent, "children": self.children,
                                                             "tracking_uri": self.uri}))
        all_params = flatten(self.settings.public_dict(), "config.")
        all_params.update(flatten(params))
        all_params["systems"] = ",".join(self.systems)
        if prompts:
            all_params.update(self._prompt_params(prompts))
        self._log_params(self.parent, all_params)
        for system, run_id in self.children.items():
            self._log_params(run_id, {"system": system})
        self._load_resumed_rows()
        atexit.register(self._at_exit)
        return self.parent

    def _reopen(self, tags: dict[str, str]) -> bool:
        """On resume: reopen the recorded runs (status RUNNING again, this process's pid). False if none."""
        from mlflow.exceptions import MlflowException

        path = self.out_dir / RUN_FILE
        if not (self.resume and path.exists()):
            return False
        try:
            saved = json.loads(path.read_text())
            runs = [saved["parent"], *saved["children"].values()]
            for run_id in runs:
                self.client.get_run(run_id)
        except (ValueError, KeyError, MlflowException) as exc:
            log.warning("cannot reopen the MLflow runs in %s (%s): a new run is started", path, exc)
            return False
        self.parent, self.children = saved["parent"], dict(saved["children"])
        for system in self.systems:  # a system added on resume gets its child
            if system not in self.children:
                exp = self.client.get_run(self.parent).info.experiment_id
                self.children[system] = self.client.create_run(
                    exp, run_name=system, tags={**tags, _PARENT_TAG: self.parent}).info.run_id
        for run_id in [self.parent, *self.children.values()]:
            self.client.update_run(run_id, status="RUNNING")
            for k, v in tags.items():
                self.client.set_tag(run_id, k, v)
        self.client.set_tag(self.parent, "nemori.resumed", str(int(time.time())))
        path.write_text(json.dumps({"parent": self.parent, "children": self.children, "tracking_uri": self.uri}))
        self.resumed = True
        return True

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Log params; on a reopened run only the ones not logged yet (MLflow params are immutable)."""
        from mlflow.entities import Param

        have = self.client.get_run(run_id).data.params if self.resumed else {}
        new = [Param(k, v) for k, v in params.items() if k not in have]
        changed = sorted(k for k, v in params.items() if k in have and have[k] != v)
        if changed:
            log.warning("resumed run %s: params %s differ from the first invocation's; the first values are kept",
                        run_id, ", ".join(changed[:10]))
        for i in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[i:i + 100])

    def _prompt_params(self, prompts: dict[str, str]) -> dict[str, str]:
        """``prompt.<stage>`` (hash) and ``prompt_version.<stage>`` (registry version) of the prompts that run;
        ``prompt.<name>`` of the other signatures (judges: ``signatures.signature_hash``)."""
        from mlflow.exceptions import MlflowException

        from nemori_dspy.signatures import SIGNATURES, signature_hash

        # prompts outside the pipeline (judges): their code signature is what runs
        out = {f"prompt.{k}": signature_hash(sig) for k, sig in SIGNATURES.items() if k not in prompts}
        out.update({f"prompt.{stage}": prompt_hash(text) for stage, text in prompts.items()})
        try:
            self._versions = register_prompts(prompts)
            out.update({f"prompt_version.{k}": str(v) for k, v in self._versions.items()})
        except MlflowException as exc:  # e.g. a file-store backend without a prompt registry
            log.warning("prompt registry unavailable (%s); prompts are still logged as prompts.json", exc)
        self._prompts = prompts
        return out

    def _load_resumed_rows(self) -> None:
        """On resume: running sums from the answers already in ``results.jsonl``; rows the table lacks are queued."""
        path = self.out_dir / "results.jsonl"
        if not (self.resumed and path.exists()):
            return
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        have = self._table_keys()
        for row in rows:
            self._add_sums(row)
            if (row["system"], row["sample_id"], row["index"]) not in have:
                self._pending.append(row)
        self._logged_rows = len(have)

    def _table_keys(self) -> set[tuple[Any, Any, Any]]:
        import mlflow
        from mlflow.exceptions import MlflowException

        try:
            df = mlflow.load_table("answers.json", run_ids=[self.parent])
        except (MlflowException, OSError, KeyError):
            return set()
        return set(zip(df["system"], df["sample_id"], df["index"]))

    # ------------------------------------------------------------------ the runner's RunObserver
    def span(self, name: str, **tags: Any) -> Any:
        """Root span of one unit of work (``eval.tracing.trace_group``) when tracing is on, else a no-op."""
        if self._spans is None:
            return nullcontext()
        from nemori_dspy.eval.tracing import trace_group

        return trace_group(name, self.parent, **tags)

    def answered(self, row: dict[str, Any]) -> None:
        """Log one answer: its verdicts on its trace (when traced), step metrics now, the table row now or soon (see
        the module docstring)."""
        from mlflow.entities import Metric

        self._assess(row)
        now_ms = int(time.time() * 1000)
        with self._lock:
            self._answers += 1
            step = self._add_sums(row)
            means = {m: sum(v) / len(v) for m, v in self._sums[row["system"]].items() if v and m != "_n"}
            self._pending.append(row)
            flush = self._logged_rows < _EAGER_ROWS or time.monotonic() - self._last_flush >= _ROW_EVERY_S
        system = row["system"]
        self.client.log_batch(self.parent, metrics=[
            Metric("progress.answers", float(self._answers), now_ms, self._answers),
            *(Metric(f"running.{system}.{m}", v, now_ms, step) for m, v in means.items())])
        if system in self.children:
            self.client.log_batch(self.children[system], metrics=[
                Metric(f"running.{m}", v, now_ms, step) for m, v in means.items()])
        if flush:
            self.flush_rows()

    def _assess(self, row: dict[str, Any]) -> None:
        """The row's judge verdicts (``eval.genai.verdict_feedbacks``) and gold answer as assessments on the trace of
        the answer (the active one: ``answered`` is called inside the answer's span); nothing when not traced."""
        if self._spans is None:
            return
        import mlflow
        from mlflow.exceptions import MlflowException

        from nemori_dspy.eval.genai import gold_expectation, verdict_feedbacks

        trace_id = mlflow.get_active_trace_id()
        if trace_id is None:
            return
        try:
            for assessment in [gold_expectation(row.get("gold", "")), *verdict_feedbacks(row.get("verdicts") or {},
                                                                                          self.judge_models)]:
                mlflow.log_assessment(trace_id=trace_id, assessment=assessment)
        except MlflowException as exc:  # an assessment must not cost the eval its answer
            log.warning("assessments not logged on trace %s: %s", trace_id, exc)

    def log_input(self, dataset: Any, context: str = "eval") -> None:
        """Log ``dataset`` (an ``mlflow.data`` dataset, e.g. ``eval.genai.slice_input``: the questions that run) as
        an input of the parent and of every child run, with ``context`` as its ``mlflow.data.context`` tag."""
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        entity = DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
        for run_id in [self.parent, *self.children.values()]:
            self.client.log_inputs(run_id, datasets=[entity])

    @property
    def experiment_id(self) -> str:
        """The experiment of this eval's runs (after ``start``)."""
        return self.client.get_run(self.parent).info.experiment_id

    def _add_sums(self, row: dict[str, Any]) -> int:
        from nemori_dspy.eval.runner import METRICS

        sums = self._sums.setdefault(row["system"], {})
        for m in [*METRICS, "judge_strict"]:
            if isinstance(row.get(m), (int, float)):
                sums.setdefault(m, []).append(float(row[m]))
        sums.setdefault("_n", []).append(1.0)
        return len(sums["_n"])

    def flush_rows(self) -> None:
        """Append the queued answer rows to the parent's ``answers.json`` table."""
        import pandas as pd

        with self._lock:
            rows, self._pending = self._pending, []
            if not rows:
                return
            self._logged_rows += len(rows)
            self._last_flush = time.monotonic()
        df = pd.DataFrame([{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
                           for r in rows])
        self.client.log_table(self.parent, data=df, artifact_file="answers.json")

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """While active (and ``settings.mlflow_tracing``), every DSPy LM call is a span (``eval.tracing.LMSpans``)."""
        if not self.settings.mlflow_tracing:
            yield
            return
        import dspy

        from nemori_dspy.eval.tracing import LMSpans

        self._spans = LMSpans(self.parent)
        try:
            with dspy.context(callbacks=[*dspy.settings.get("callbacks", []), self._spans]):
                yield
        finally:
            self._spans = None
            # MLflow exports finished traces on a background queue (MLFLOW_ENABLE_ASYNC_TRACE_LOGGING, on by
            # default): without this drain the last calls' traces (e.g. the judge audit's) can still be
            # queued when the run is ended and read back, so the run shows fewer spans than LM calls.
            import mlflow

            mlflow.flush_trace_async_logging()

    # ------------------------------------------------------------------ end
    def finish(self, summary: RunSummary, program: dict[str, Any] | None = None,
               register_model: str | None = None) -> str:
        """Final metrics, artifacts and the program model; ends every run FINISHED. Returns the parent run id."""
        import mlflow

        self.flush_rows()
        self.resumed = True  # params from here on: only those not logged at start
        if isinstance(summary, RunResult):
            _charts(summary, self.out_dir)
        self.client.log_batch(self.parent, metrics=_metrics(summary))
        self._log_params(self.parent, _judge_params(summary))
        if self._prompts:
            self.client.log_dict(self.parent, {k: json.loads(v) for k, v in self._prompts.items()}, "prompts.json")
        self._move_eval_alias()
        self.client.log_artifacts(self.parent, str(self.out_dir))
        for system, scores in summary.scores.items():  # unprefixed: the child run is the system
            if system in self.children:
                self.client.log_batch(self.children[system], metrics=_as_metrics(
                    {k: float(v) for k, v in scores.items()}))
        if program is not None:
            from nemori_dspy.eval.model import log_program_model

            try:
                uri = log_program_model(self.settings, program, self.parent, register_model)
                self.client.set_tag(self.parent, "nemori.program_model", uri)
            except (mlflow.exceptions.MlflowException, OSError, TypeError, ValueError) as exc:
                log.warning("the program could not be logged as an MLflow model (%s); it is in program.json", exc)
        self.end("FINISHED")
        return self.parent

    def _move_eval_alias(self) -> None:
        """Point ``@latest-eval`` of every stage prompt at the version this (finished) eval ran."""
        from mlflow.exceptions import MlflowException

        try:
            set_prompt_aliases(self._versions, EVAL_ALIAS)
        except MlflowException as exc:  # the record must not be lost over an alias
            log.warning("prompt alias @%s not set (%s)", EVAL_ALIAS, exc)

    def end(self, status: str) -> None:
        """End the child runs and the parent with ``status`` (FINISHED, FAILED, KILLED); idempotent."""
        from mlflow.exceptions import MlflowException

        with self._lock:
            if self._closed or self.parent is None:
                return
            self._closed = True
        if status != "FINISHED":  # what it had: the rows, the checkpoint and the cost so far
            try:
                self.flush_rows()
                for name in ("results.jsonl", "cost.json"):
                    if (self.out_dir / name).exists():
                        self.client.log_artifact(self.parent, str(self.out_dir / name))
            except (MlflowException, OSError, ValueError) as exc:  # a dying run must still get its status
                log.warning("answer rows not flushed: %s", exc)
        for run_id in [*self.children.values(), self.parent]:
            self.client.set_terminated(run_id, status=status)
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        self.end("KILLED")

    def __enter__(self) -> "EvalTracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.end("FINISHED")
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            self.end("KILLED")
        else:
            self.end("FAILED")


def log_eval_run(settings: NemoriSettings, summary: RunSummary, out_dir: Path, extra_params: dict[str, Any],
                 run_name: str | None = None, pipeline: Any = None) -> str:
    """Log a finished eval in one go (parent + a child per system): ``EvalTracker.start`` then ``finish``.

    ``pipeline``: the pipeline that ran (its prompts give the lineage params, its state the program model);
    None → the code's default prompts, no model. Returns the parent run id; see ``_metrics`` for metric names.
    """
    from nemori_dspy.eval.model import ProgramModel, program_state

    module = pipeline if pipeline is not None else ProgramModel(settings)
    tracker = EvalTracker(settings, out_dir, summary.systems or list(summary.scores),
                          run_name or Path(out_dir).name)
    with tracker:
        tracker.start(extra_params, stage_prompts(module))
        return tracker.finish(summary, program_state(pipeline) if pipeline is not None else None)


def _judge_params(summary: RunSummary) -> dict[str, str]:
    """``<judge>.{model,prompt_hash,failures}`` per judge of the panel (``judge``, ``judge_strict``)."""
    params: dict[str, str] = {}
    for name, info in (summary.judges or ({"judge": summary.judge} if summary.judge else {})).items():
        params.update(flatten(info.model_dump(), f"{name}."))
    return params


def _as_metrics(values: dict[str, float]) -> list[Any]:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, 0) for k, v in values.items()]


def _metrics(summary: RunSummary) -> list[Any]:
    """The final metrics of an eval summary.

    Names: ``<system>.<metric>.<category>`` (e.g. ``nemori.judge.overall``, ``n.temporal``),
    ``cost.<stage>.{calls,cache_hits,failures,input_tokens,output_tokens,seconds,cost_usd}`` (all usage),
    ``construction.<stage>.<field>`` (memory construction only), ``counter.<name>``, ``embedding.<field>``,
    ``judge_audit.<judge>.{on_gold,on_wrong,overall,n_gold,n_wrong,n}``, ``ingest_seconds``, ``answer_seconds``,
    ``stage.<stage>.calls_per_{100_turns,episode}`` and ``guard.<counter>.per_100_turns`` (stage activity).
    """
    metrics: dict[str, float] = {}
    for system, scores in summary.scores.items():
        metrics.update({f"{system}.{k}": float(v) for k, v in scores.items()})
    for stage, usage in summary.usage.items():
        metrics.update({f"cost.{stage}.{k}": float(v) for k, v in usage.items()})
    for stage, usage in summary.construction_usage.items():
        metrics.update({f"construction.{stage}.{k}": float(v) for k, v in usage.items()})
    metrics.update({f"counter.{k}": float(v) for k, v in summary.counters.items()})
    if summary.embedding_usage:
        metrics.update({f"embedding.{k}": float(v) for k, v in summary.embedding_usage.model_dump().items()})
    for name, audit in (summary.judge_audit_dicts() or {}).items():
        metrics.update({f"judge_audit.{name}.{k}": float(v) for k, v in audit.items() if v is not None})
    metrics["ingest_seconds"] = float(summary.ingest_seconds)
    metrics["answer_seconds"] = float(summary.answer_seconds)
    from nemori_dspy.eval.memory_quality import memory_metrics  # memory.<metric>

    metrics.update(memory_metrics(summary.memory))
    if summary.stage_activity:  # stage.<stage>.calls_per_100_turns / calls_per_episode, guard.<counter>.*
        from nemori_dspy.eval.stage_activity import stage_metrics
        metrics.update(stage_metrics(summary.stage_activity))
    return _as_metrics(metrics)


def _charts(result: RunResult, out_dir: Path) -> None:
    from nemori_dspy.eval.charts import category_bar_chart, cost_by_stage_chart

    metric = (result.judge_metrics or (["judge"] if result.judge else ["f1"]))[0]
    try:
        category_bar_chart(result.rows, metric, result.systems, out_dir / f"scores_by_category_{metric}.png",
                           groups=result.groups, benchmark=result.benchmark or "LoCoMo")
        cost_by_stage_chart(result.construction_usage or result.usage, out_dir / "cost_by_stage.png")
    except (ImportError, ValueError, OSError) as exc:  # a chart must never cost the run its record
        log.warning("chart failed: %s", exc)
