"""The stage registry: one row per LLM stage of the pipeline (one prompt of the paper, Appendix D), in order.

Every list of stages in the package derives from ``STAGE_TABLE``: ``config.STAGES`` and
``config.DEFAULT_STAGE_MAX_TOKENS``, ``signatures.SIGNATURES``, the construction stages of ``eval`` (runner,
cache key, stage activity), the predictor paths of ``NemoriPipeline`` (``PIPELINE_PATHS``), the batched
predictors a saved program may lack (``BATCHED_STAGES``) and what ``optimize`` can tune (``TUNABLE_STAGES``).
Adding a stage is one row here plus its signature class and the module that calls it.

This module imports nothing of the package (``config`` and ``signatures`` import it); a row names its
signature class by name and :meth:`Stage.signature_class` resolves it on use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Stage", "STAGE_TABLE", "STAGE_BY_NAME", "stage", "STAGES", "CONSTRUCTION_STAGES", "ANSWER_STAGES",
           "DEFAULT_STAGE_MAX_TOKENS", "MEMORY_WRITING_STAGES", "PIPELINE_PATHS", "BATCHED_STAGES",
           "SALVAGE_TRUNCATED_STAGES", "KEEP_AFTER_REASK_STAGES", "TRUNCATED_LIST_STAGES", "TUNE_GROUPS",
           "TUNABLE_STAGES"]

Side = Literal["construction", "answer", "judge"]
Truncation = Literal["reask", "reask_keep", "keep", "keep_list"]


@dataclass(frozen=True)
class Stage:
    """One LLM stage.

    Attributes:
        name: ledger, ``stage_lms`` and program name (``"narrate"``).
        signature: class name in ``nemori_dspy.signatures`` (``"NarrateEpisode"``).
        side: ``construction`` (writes or shapes memory), ``answer`` (P_ans) or ``judge`` (scores answers,
            outside the pipeline).
        path: attribute path of its ``StagePredict`` in ``NemoriPipeline`` (``"episodic.narrate"``); None for
            stages outside the pipeline (the judge).
        max_tokens: default output cap in tokens (``NemoriSettings.stage_max_tokens``).
        batched: for a per-item stage, the stage that does every item of a call at once (cost switch).
        batch_of: for a batched stage, the per-item stage it replaces.
        tunable: ``optimize --stage <name>`` tunes it (it has a stage metric and a program).
        writes_memory: its reply becomes or decides what memory holds, so ``local_memory_model`` serves it.
        truncated: what a reply cut at the cap becomes: asked again with twice the cap (``reask``); asked again
            so and, cut again, kept as it parses (``reask_keep``: an answer that loops past its cap still begins
            with the answer, where failing would leave none); kept as it parses (``keep``, prose), or kept without
            its last list item (``keep_list``).
        paper: the paper's prompt and section.
    """

    name: str
    signature: str
    side: Side
    path: str | None
    max_tokens: int
    batched: str | None = None
    batch_of: str | None = None
    tunable: bool = False
    writes_memory: bool = False
    truncated: Truncation = "reask"
    paper: str = ""

    def signature_class(self) -> type:
        """The ``dspy.Signature`` subclass :attr:`signature` names (imports ``nemori_dspy.signatures``)."""
        from nemori_dspy import signatures

        return getattr(signatures, self.signature)


#: The stages in pipeline order (batched variants, Nemori-s and flat management after the per-item stages).
#: Caps: small models otherwise ramble until ``max_tokens``, so a cap bounds the cost of a bad reply; narrate's
#: 384 fits a whole topic of a session. Override per stage with ``stage_lms={"narrate": {"max_tokens": 600}}``.
STAGE_TABLE: tuple[Stage, ...] = (
    Stage("partition", "PartitionMessages", "construction", "episodic.partition", 320, paper="P_par §3.2.1"),
    Stage("narrate", "NarrateEpisode", "construction", "episodic.narrate", 384, batched="narrate_batch",
          tunable=True, writes_memory=True, truncated="keep", paper="P_nar §3.2.2"),
    Stage("select", "SelectContinuation", "construction", "episodic.select", 24, writes_memory=True,
          paper="P_sel §3.2.3"),
    Stage("integrate", "IntegrateEpisodes", "construction", "episodic.integrate", 400, writes_memory=True,
          truncated="keep", paper="P_int §3.2.3"),
    Stage("anticipate", "AnticipateEpisode", "construction", "semantic.anticipate", 200, tunable=True,
          writes_memory=True, truncated="keep", paper="P_ant §3.3.1"),
    Stage("distill", "DistillPredictionError", "construction", "semantic.distill", 320, tunable=True,
          writes_memory=True, truncated="keep_list", paper="P_dis §3.3.2"),
    Stage("consolidate", "ConsolidateKnowledge", "construction", "semantic.consolidate", 160,
          batched="consolidate_batch", tunable=True, writes_memory=True, paper="P_con §3.3.3"),
    # the Nemori-s ablation: facts straight from the messages, without P_ant
    Stage("direct_distill", "DistillDirect", "construction", "semantic.direct_distill", 320, writes_memory=True,
          truncated="keep_list", paper="Nemori-s, Appendix D.2"),
    # cost switches: P_nar for every group of a window in one call (narration_mode), P_con for every insight of
    # an episode in one call (consolidation_mode)
    Stage("narrate_batch", "NarrateEpisodes", "construction", "episodic.narrate_batch", 1200,
          batch_of="narrate", writes_memory=True, paper="P_nar, batched"),
    Stage("consolidate_batch", "ConsolidateKnowledgeBatch", "construction", "semantic.consolidate_batch", 600,
          batch_of="consolidate", writes_memory=True, paper="P_con, batched"),
    # flat summarization management
    Stage("summarize", "UpdateSummary", "construction", "semantic.summarize", 600, writes_memory=True,
          paper="P_sum, Appendix A.1"),
    Stage("answer", "AnswerQuestion", "answer", "response.answer", 64, tunable=True, truncated="reask_keep",
          paper="P_ans §3.4"),
    Stage("judge", "JudgeAnswer", "judge", None, 96, paper="LoCoMo LLM judge, Appendix D.4.1"),
)

#: name → row.
STAGE_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGE_TABLE}


def stage(name: str) -> Stage:
    """The registry row of ``name``.

    Raises:
        KeyError: ``name`` is not a stage (the message lists the stages).
    """
    try:
        return STAGE_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}") from None


#: Every stage name, in pipeline order (the keys ``stage_lms`` accepts).
STAGES: tuple[str, ...] = tuple(s.name for s in STAGE_TABLE)
#: Stages that build memory (everything before P_ans), in pipeline order.
CONSTRUCTION_STAGES: tuple[str, ...] = tuple(s.name for s in STAGE_TABLE if s.side == "construction")
#: Stages that answer from memory.
ANSWER_STAGES: tuple[str, ...] = tuple(s.name for s in STAGE_TABLE if s.side == "answer")
#: Default output cap per stage, in tokens.
DEFAULT_STAGE_MAX_TOKENS: dict[str, int] = {s.name: s.max_tokens for s in STAGE_TABLE}
#: Stages whose replies become or decide what memory holds: ``local_memory_model`` serves them. P_par stays on the
#: main model: its reply is only where episodes end.
MEMORY_WRITING_STAGES: tuple[str, ...] = tuple(s.name for s in STAGE_TABLE if s.writes_memory)
#: stage → attribute path of its ``StagePredict`` in ``NemoriPipeline`` (stages the pipeline runs).
PIPELINE_PATHS: dict[str, str] = {s.name: s.path for s in STAGE_TABLE if s.path is not None}
#: Batched stages: added after programs were first saved, so a program without them still loads.
BATCHED_STAGES: frozenset[str] = frozenset(s.name for s in STAGE_TABLE if s.batch_of)
#: Stages whose reply cut by its cap is kept when it parses, without a re-ask (prose, or lists of independent
#: items); answers and structured replies are asked again with twice the cap.
SALVAGE_TRUNCATED_STAGES: frozenset[str] = frozenset(s.name for s in STAGE_TABLE
                                                     if s.truncated in ("keep", "keep_list"))
#: Stages whose reply, cut again after the re-ask at twice the cap, is kept as it parses (``reask_keep``).
KEEP_AFTER_REASK_STAGES: frozenset[str] = frozenset(s.name for s in STAGE_TABLE if s.truncated == "reask_keep")
#: The list stages among them: a cut list also loses its last item, the one the cap may have cut.
TRUNCATED_LIST_STAGES: frozenset[str] = frozenset(s.name for s in STAGE_TABLE if s.truncated == "keep_list")
#: Tunable stages ``optimize`` can also tune together as one program, named ``"a+b"``.
TUNE_GROUPS: tuple[tuple[str, ...], ...] = (("anticipate", "distill"),)


def _tunable() -> tuple[str, ...]:
    """Tunable stages in pipeline order, each group right after its last member."""
    out: list[str] = []
    for s in STAGE_TABLE:
        if s.tunable:
            out.append(s.name)
            out.extend("+".join(g) for g in TUNE_GROUPS if g[-1] == s.name)
    return tuple(out)


#: What ``optimize --stage`` accepts, in pipeline order (``anticipate+distill`` tunes both as one program).
TUNABLE_STAGES: tuple[str, ...] = _tunable()
