"""Typed records of an eval run: what ``summary.json`` holds (``RunSummary``) and what a run returns (``RunResult``).

``eval.runner.summarise`` builds them; ``run_locomo`` and ``run_longmemeval`` return a ``RunResult``; the CLI
prints it and ``eval.tracking`` logs it to MLflow. On disk ``summary.json`` is ``RunSummary.model_dump(mode="json")``
(``write``); ``load_summary`` reads it back, older files (fewer sections) included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemori_dspy.errors import DatasetError

__all__ = ["Coverage", "EmbeddingUsage", "JudgeInfo", "JudgeAudit", "RunSummary", "RunResult", "load_summary"]

#: ``{"<metric>.<group>": mean in [0, 1], "n.<group>": questions}`` of one system (e.g. ``judge.overall``).
SystemScores = dict[str, int | float]
#: stage → ``Usage.model_dump()`` (``calls``, ``cache_hits``, ``failures``, tokens, ``seconds``, ``cost_usd``).
StageUsage = dict[str, dict[str, int | float]]


class Coverage(BaseModel):
    """Of one conversation's messages: how many sit in exactly one live episode, in none, or in several."""

    messages: int = Field(description="messages (turns) of the conversation")
    in_one_episode: int = Field(description="messages in exactly one live episode")
    in_no_episode: int = Field(description="messages in no episode")
    in_several: int = Field(description="messages in more than one episode")
    episodes: int = Field(description="live episodes of the conversation's user")


class EmbeddingUsage(BaseModel):
    """The run's embedder totals, apart from LLM calls."""

    calls: int = Field(0, description="embed() batches")
    texts: int = Field(0, description="texts embedded")
    tokens: int = Field(0, description="input tokens, when the provider reports them")
    seconds: float = Field(0.0, description="wall seconds of the embed calls")
    cost_usd: float = Field(0.0, description="dollars (litellm's price; 0 for local)")


class JudgeInfo(BaseModel):
    """What makes one judge's scores comparable across runs."""

    model_config = ConfigDict(extra="allow")

    model: Any = Field(None, description="the judge's LM (name)")
    prompt_hash: str | None = Field(None, description="hash of the judge's prompt")
    failures: int = Field(0, description="judge calls with no usable verdict")


class JudgeAudit(BaseModel):
    """One judge on the calibration set: accuracy (in [0, 1], None without pairs) on gold and known-wrong answers."""

    on_gold: float | None = Field(None, description="share of gold answers judged CORRECT")
    on_wrong: float | None = Field(None, description="share of known-wrong answers judged WRONG")
    overall: float | None = Field(None, description="accuracy over both")
    n_gold: int = Field(0, description="gold pairs")
    n_wrong: int = Field(0, description="known-wrong pairs")
    n: int = Field(0, description="all pairs")


class RunSummary(BaseModel):
    """``summary.json``: scores, cost and memory figures of one eval run.

    Sections an older file lacks take their defaults; ``longmemeval`` and ``benchmark`` are only written by
    LongMemEval runs (``to_json`` leaves them out when None, as the files always have).
    """

    scores: dict[str, SystemScores] = Field(default_factory=dict,
                                            description="system → {'<metric>.<group>': mean, 'n.<group>': count}")
    usage: StageUsage = Field(default_factory=dict, description="all LLM usage of the run per stage")
    construction_usage: StageUsage = Field(default_factory=dict, description="memory construction usage per stage")
    embedding_usage: EmbeddingUsage | None = Field(None, description="embedder totals")
    counters: dict[str, int] = Field(default_factory=dict, description="ledger counters: name → count")
    coverage: dict[str, Coverage] = Field(default_factory=dict, description="conversation (label) → episode coverage")
    parked: list[str] = Field(default_factory=list, description="work parked after failures (one line each)")
    reused_memory: list[str] = Field(default_factory=list, description="conversations whose memory was reused")
    ingest_seconds: float = Field(0.0, description="memory construction wall seconds over the whole run")
    answer_seconds: float = Field(0.0, description="answering and judging wall seconds of the last invocation")
    concurrency: int = Field(1, description="conversations built and questions answered at once (--concurrency)")
    resumed_answers: int = Field(0, description="answers already in results.jsonl when the run resumed")
    systems: list[str] = Field(default_factory=list, description="the systems answered, in order")
    questions: int = Field(0, description="distinct questions answered")
    judge: JudgeInfo | None = Field(None, description="the main judge (None without a judge)")
    judges: dict[str, JudgeInfo] = Field(default_factory=dict, description="metric name → judge of the panel")
    judge_metrics: list[str] = Field(default_factory=list, description="the judges' score names, in order")
    judge_audit: dict[str, JudgeAudit] | None = Field(None, description="judge → calibration accuracy")
    paired: dict[str, Any] | None = Field(None, description="``metrics.paired_stats``: vs the baseline (2+ systems)")
    stage_activity: dict[str, Any] | None = Field(
        None, description="``stage_activity.stage_activity``: {turns, episodes, stages, guards}")
    memory: dict[str, Any] | None = Field(None, description="``memory_quality.memory_report``: {systems, caption, table}")
    longmemeval: dict[str, Any] | None = Field(
        None, description="LongMemEval only: system → metric → {task_averaged, abstention, ...}")
    benchmark: str | None = Field(None, description="'LongMemEval' for LongMemEval runs; None (LoCoMo) otherwise")

    def judge_audit_dicts(self) -> dict[str, dict[str, Any]] | None:
        """``judge_audit`` as plain dicts (``judge_audit.audit_table``'s input); None without an audit."""
        return {k: v.model_dump() for k, v in self.judge_audit.items()} if self.judge_audit else None

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` form: ``model_dump(mode="json")`` of the summary's own fields."""
        data = self.model_dump(mode="json", include=set(RunSummary.model_fields))
        for key in ("embedding_usage", "longmemeval", "benchmark"):
            if data[key] is None:
                del data[key]
        return data

    def write(self, path: Path) -> None:
        """Write ``summary.json`` (two-space indented JSON)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, default=str))


class RunResult(RunSummary):
    """What ``run_locomo`` / ``run_longmemeval`` return: the summary plus what is printed but not saved."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    table: str = Field("", description="scores ×100 per group with 95% CI (``metrics.category_table``)")
    usage_table: str = Field("", description="LLM usage per stage (``UsageLedger.table``)")
    rows: list[dict[str, Any]] = Field(default_factory=list, description="answer rows (``results.jsonl``)")
    groups: list[Any] | None = Field(None, description="the table's row groups (``metrics.Group``); None: LoCoMo's")
    paired_table: str | None = Field(None, description="paired differences text (2+ systems)")

    def summary(self) -> RunSummary:
        """The part ``summary.json`` holds."""
        return RunSummary.model_validate(self.to_json())


def load_summary(path: Path) -> RunSummary:
    """Read a ``summary.json`` (older ones, with fewer sections, included).

    Raises:
        DatasetError: the file is not JSON or not a run summary.
    """
    try:
        return RunSummary.model_validate_json(Path(path).read_text())
    except ValidationError as exc:
        raise DatasetError(f"{path} is not an eval run summary ({exc.error_count()} errors: {exc.errors()[0]['msg']} "
                           f"at {'.'.join(map(str, exc.errors()[0]['loc']))}); re-run the eval to rewrite it") from exc
