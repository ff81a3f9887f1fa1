"""``NemoriPipeline``: the whole method as one ``dspy.Module`` graph with stable predictor names.

Predictor names (for optimizers and save/load): ``episodic.{partition,narrate,select,integrate}``,
``semantic.{anticipate,distill,consolidate,direct_distill}`` (``semantic.summarize`` under flat
management, Appendix A.1), ``response.answer`` (each wraps a ``.predict``); only the predictors the
configuration runs exist (``semantic.anticipate``/``distill`` or ``semantic.direct_distill``;
``semantic.consolidate`` with consolidation on). ``save(path)``/``load(path)`` round-trip instructions and
demos of all of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy

from ..config import NemoriSettings
from ..errors import ConfigError, LLMError
from ..predict import StagePredict, load_predictor_class
from ..recording import current_recorder, stage_meta
from ..signatures import SIGNATURES
from ..signatures.demos import seed_demos
from ..stages import BATCHED_STAGES, PIPELINE_PATHS
from ..usage import tally
from ..types import Episode, StoredMessage
from .episodic import EpisodicIntegration, split_at_gaps
from .resources import Resources
from .response import ResponseGeneration
from .flat import FlatSummaryDistillation
from .semantic import SemanticDistillation, dated_cue

__all__ = ["BATCHED_STAGES", "NemoriPipeline", "ProcessReport", "stage_factory", "KNOWN_BEFORE_TOP_K",
           "closed_segments", "pipeline_stage", "pipeline_stage_owner"]

#: semantic entries nearest an episode recorded as "already known" before its distillation (tuning data only).
KNOWN_BEFORE_TOP_K = 10

log = logging.getLogger(__name__)



def stage_factory(settings: NemoriSettings, stage_lms: dict[str, dspy.BaseLM] | None = None,
                  predictor_classes: dict[str, str] | None = None) -> Callable[[str], dspy.Module]:
    """Build ``make(stage) -> StagePredict`` from settings: per-stage max_tokens, LM and predictor class.

    ``predictor_classes`` (default ``settings.predictor_classes``) maps a stage to a dotted class path,
    e.g. ``{"answer": "dspy.ChainOfThought"}``; the class is called with the stage's signature. With
    ``settings.seed_demos`` each stage starts with its hand-written demos (``signatures.demos.SEED_DEMOS``).
    """
    stage_lms = stage_lms or {}
    predictor_classes = predictor_classes if predictor_classes is not None else settings.predictor_classes

    def make(name: str) -> dspy.Module:
        cls = load_predictor_class(predictor_classes[name]) if name in predictor_classes else dspy.Predict
        stage = StagePredict(SIGNATURES[name], name, max_tokens=settings.stage_max_tokens(name),
                             parse_retries=settings.parse_retries, lm=stage_lms.get(name), predictor_class=cls)
        if settings.seed_demos:
            for _, predictor in stage.named_predictors():
                predictor.demos = seed_demos(name)
        return stage

    return make


def _semantic_module(resources: Resources, make: Callable[[str], dspy.Module]) -> dspy.Module:
    """The semantic management ``settings.semantic_management`` names: structured (§3.3) or flat (App. A.1)."""
    if resources.settings.semantic_management == "flat":
        return FlatSummaryDistillation(resources, make)
    return SemanticDistillation(resources, make)


def closed_segments(window: list[StoredMessage], settings: NemoriSettings, hold: bool) -> list[StoredMessage]:
    """The messages of ``window`` that form episodes now: all of them, or with ``settings.hold_open_segment``
    and ``hold`` (more messages may follow) those before the window's last time gap
    (``episode_split_gap_hours``), so the run after it waits for the next window (counted as
    ``segments_held``). A window without a gap is formed whole."""
    if not (hold and settings.hold_open_segment):
        return window
    runs = split_at_gaps(window, settings.episode_split_gap_hours, settings.naive_timezone)
    if len(runs) < 2:
        return window
    tally("segments_held")
    return window[:len(window) - len(runs[-1])]


@dataclass
class ProcessReport:
    """What one processing pass did: windows, episodes, merges, semantic changes, and parked work."""

    windows: int = 0
    episodes: int = 0
    superseded: int = 0
    distilled: int = 0
    semantic_inserts: int = 0
    semantic_deletes: int = 0
    parked: list[str] = field(default_factory=list)


class NemoriPipeline(dspy.Module):
    """Episodic integration → semantic distillation → response generation over one store.

    Args:
        resources: store, embedder and settings (shared, never deep-copied).
        make: predictor factory (see ``stage_factory``); default from ``resources.settings``.
        episodic / semantic / response: replacement modules with the same ``forward`` contract.
    """

    def __init__(self, resources: Resources, make: Callable[[str], dspy.Module] | None = None,
                 episodic: dspy.Module | None = None, semantic: dspy.Module | None = None,
                 response: dspy.Module | None = None) -> None:
        super().__init__()
        self.res = resources
        make = make or stage_factory(resources.settings)
        self.episodic = episodic or EpisodicIntegration(resources, make)
        self.semantic = semantic or _semantic_module(resources, make)
        self.response = response or ResponseGeneration(resources, make)

    def process_window(self, user_id: str, force: bool, report: ProcessReport) -> bool:
        """Form episodes from the next window if it is full (or ``force``); True if one was committed."""
        store, w = self.res.store, self.res.settings.window_size
        pending = store.pending_messages(user_id, limit=w + 1)
        more, pending = len(pending) > w, pending[:w]
        if not pending or (len(pending) < w and not force):
            return False
        pending = closed_segments(pending, self.res.settings, hold=more or not force)
        window = store.next_window(user_id)
        try:
            with stage_meta(user_id=user_id, window=window):
                pred = self.episodic(user_id=user_id, messages=pending, window=window)
        except LLMError as exc:
            report.parked.append(f"window {window} ({len(pending)} messages stay buffered): {exc}")
            tally("parked_windows")
            return False
        store.commit_window(user_id, window, pred.episodes, pred.superseded)
        report.windows += 1
        report.episodes += len(pred.episodes)
        report.superseded += len(pred.superseded)
        return True

    def distill_pending(self, user_id: str, report: ProcessReport) -> None:
        """Distill every committed-but-undistilled episode, committing each atomically."""
        for ep in self.res.store.episodes_to_distill(user_id):
            try:
                with stage_meta(**self._distill_meta(user_id, ep)):
                    pred = self.semantic(user_id=user_id, episode=ep)
            except LLMError as exc:
                report.parked.append(f"episode {ep.id} distillation: {exc}")
                tally("parked_distillations")
                continue
            self.res.store.commit_distillation(user_id, ep.id, pred.inserts, pred.deletes)
            report.distilled += 1
            report.semantic_inserts += len(pred.inserts)
            report.semantic_deletes += len(pred.deletes)

    def _distill_meta(self, user_id: str, ep: "Episode") -> dict:
        """Record meta of one distillation: the episode, its messages and, only while recording (it costs a
        search), the texts of the semantic entries nearest to it before distilling — what the distill metric
        counts as "already known" (``nemori_dspy.optimizers.metrics``)."""
        meta = {"user_id": user_id, "episode_id": ep.id, "message_ids": list(ep.message_ids),
                "episode_cue": dated_cue(ep)}
        if current_recorder() is not None:
            hits = self.res.store.search_semantic(user_id, ep.vector, KNOWN_BEFORE_TOP_K)
            meta["known_before"] = [h.entry.text for h in hits]
        return meta

    def process(self, user_id: str, force: bool = False, max_windows: int | None = None) -> ProcessReport:
        """Process full windows (all pending messages if ``force``), distilling after each window;
        at most ``max_windows`` windows if given."""
        report = ProcessReport()
        self.distill_pending(user_id, report)  # finish work a crash or failure left behind
        while (max_windows is None or report.windows < max_windows) and self.process_window(user_id, force, report):
            self.distill_pending(user_id, report)
            if report.parked:
                break
        return report

    def load_state(self, state: dict, **kwargs: Any) -> "NemoriPipeline":
        """DSPy's ``load_state``, with a clear error when the saved program lacks a predictor this
        configuration runs (e.g. saved with ``distillation="direct"``, loaded with prediction-error
        distillation). A program saved before a batched stage existed (``narrate_batch``,
        ``consolidate_batch``) loads: those predictors keep their untuned state (logged). State of
        predictors this configuration does not run is ignored.

        Raises:
            ConfigError: a predictor of this pipeline (other than a batched one) has no state in ``state``.
        """
        absent = [name for name, _ in self.named_parameters() if name not in state]
        later = {n: p.dump_state(json_mode=False) for n, p in self.named_parameters()
                 if n in absent and n.split(".")[1] in BATCHED_STAGES}
        missing = [n for n in absent if n not in later]
        if missing:
            s = self.res.settings
            raise ConfigError(f"the saved program has no state for {', '.join(missing)}, which this configuration "
                              f"runs (distillation={s.distillation!r}, consolidation={s.consolidation}, "
                              f"semantic_management={s.semantic_management!r}). Fix: load it with the settings it "
                              "was saved with.")
        if later:
            log.info("loaded program has no state for %s; they stay untuned", sorted(later))
        super().load_state({**later, **state}, **kwargs)
        return self

    def forward(self, user_id: str, question: str, use_memory: bool = True,
                context: str | None = None) -> dspy.Prediction:
        """Answer ``question`` from the user's memory (the graph's inference entry point); with ``context``,
        P_ans answers on that text instead of a retrieved one (``ResponseGeneration.forward``)."""
        return self.response(user_id=user_id, question=question, use_memory=use_memory, context=context)


def pipeline_stage(pipeline: NemoriPipeline, stage: str) -> dspy.Module:
    """The pipeline's ``StagePredict`` of ``stage``.

    Raises:
        ConfigError: unknown stage name, or a stage the pipeline's configuration does not run (e.g.
            ``distill`` with ``distillation="direct"``: it has no such predictor).
    """
    if stage not in PIPELINE_PATHS:
        raise ConfigError(f"unknown stage {stage!r}. Fix: use one of {', '.join(PIPELINE_PATHS)}.")
    try:
        found = pipeline_stage_owner(pipeline, PIPELINE_PATHS[stage])
    except AttributeError:  # e.g. flat management's module has no consolidate at all
        found = None
    if found is None:
        s = pipeline.res.settings
        raise ConfigError(f"stage {stage!r} is not run by this configuration (distillation={s.distillation!r}, "
                          f"consolidation={s.consolidation}, semantic_management={s.semantic_management!r}), so "
                          f"the pipeline has no predictor for it. Fix: tune a stage it runs, or change "
                          f"NEMORI_DISTILLATION / NEMORI_CONSOLIDATION / NEMORI_SEMANTIC_MANAGEMENT.")
    return found


def pipeline_stage_owner(pipeline: NemoriPipeline, owner_path: str) -> Any:
    """The attribute at a dotted path of the pipeline (``"episodic"`` → ``pipeline.episodic``,
    ``"episodic.narrate"`` → its narrate stage)."""
    obj: Any = pipeline
    for part in owner_path.split("."):
        obj = getattr(obj, part)
    return obj
