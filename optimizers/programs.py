"""Stage programs: one pipeline stage (or two) as a ``dspy.Module`` an optimizer can compile.

Each program *wraps the pipeline's own* ``StagePredict`` objects, so before optimizing it is exactly what
runs in the pipeline, and ``apply_to(pipeline)`` writes a compiled copy's instructions and demos back into
the pipeline (each pipeline predictor keeps its own stage LM). Stages a program holds but does not tune
(``frozen``) are kept out of ``named_predictors()``, so optimizers cannot change them.

| stage name | program | forward inputs → outputs |
|---|---|---|
| ``narrate`` | ``NarrateProgram`` | messages → cue, narrative |
| ``distill`` | ``DistillProgram(tune=("distill",))`` | episode_messages, predicted_episode → insights |
| ``anticipate`` | ``DistillProgram(tune=("anticipate",))`` | episode_cue, known_facts, episode_messages → insights |
| ``anticipate+distill`` | ``DistillProgram(tune=("anticipate", "distill"))`` | as above, both tuned as one program |
| ``consolidate`` | ``ConsolidateProgram`` | insight, existing_entries → action, targets, merged_text |
| ``answer`` | ``AnswerProgram`` (``optimizers/answer.py``) | context, question → answer |
"""

from __future__ import annotations

import contextlib
from typing import Any

import dspy

from nemori_dspy.errors import ConfigError
from nemori_dspy.formatting import entry_texts, strip_fact_date
from nemori_dspy.insight_rules import dated_message_lines, demo_texts
from nemori_dspy.modules.episodic import polish_cue, polish_narrative
from nemori_dspy.modules.pipeline import NemoriPipeline, pipeline_stage, pipeline_stage_owner
from nemori_dspy.modules.semantic import predict_episode, settle_decision, target_numbers
from nemori_dspy.stages import PIPELINE_PATHS

__all__ = ["PIPELINE_PATHS", "StageProgram", "NarrateProgram", "DistillProgram", "ConsolidateProgram",
           "EndToEndProgram", "end_to_end_questions", "clean_insights", "pipeline_stage", "pipeline_stage_owner"]


class _Shared:
    """A value ``copy.deepcopy`` (hence ``Module.deepcopy``/``reset_copy``) passes through by reference,
    and that DSPy's parameter walk does not enter: frozen stages and stage LMs live in one."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __deepcopy__(self, memo: dict) -> "_Shared":
        return self


def _stage_lm(module: dspy.Module) -> dspy.BaseLM | None:
    lms = {p.lm for _, p in module.named_predictors() if p.lm is not None}
    return lms.pop() if len(lms) == 1 else None


class StageProgram(dspy.Module):
    """Base: holds tuned stages as attributes named after the stage, frozen ones out of the optimizer's reach.

    Calls go through ``call(stage, **inputs)``, which uses the stage's own LM when the pipeline gave it one
    (remembered: optimizers' ``reset_copy`` clears per-predictor LMs), else ``dspy.settings.lm``.
    """

    def __init__(self, pipeline: NemoriPipeline, tune: tuple[str, ...], frozen: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.tuned = tuple(tune)
        lms: dict[str, dspy.BaseLM | None] = {}
        for name in tune:
            stage = pipeline_stage(pipeline, name)
            setattr(self, name, stage)
            lms[name] = _stage_lm(stage)
        self._frozen = _Shared({name: pipeline_stage(pipeline, name) for name in frozen})
        for name in frozen:
            lms[name] = _stage_lm(self._frozen.value[name])
        self._lms = _Shared(lms)
        self._settings = _Shared(pipeline.res.settings)  # the rules around the stages read the pipeline's settings

    def stage(self, name: str) -> dspy.Module:
        """The held stage module ``name`` (tuned or frozen)."""
        return getattr(self, name) if name in self.tuned else self._frozen.value[name]

    def call(self, stage: str, **inputs: Any) -> dspy.Prediction:
        """Run one held stage (tuned or frozen) with its own LM if it has one."""
        module = self.stage(stage)
        lm = self._lms.value.get(stage)
        with dspy.context(lm=lm) if lm is not None else contextlib.nullcontext():
            return module(**inputs)

    def apply_to(self, pipeline: NemoriPipeline) -> NemoriPipeline:
        """Copy the tuned stages' instructions, demos and field prefixes into ``pipeline`` (in place).

        Each target predictor keeps its own LM; frozen stages are not touched.

        Raises:
            ConfigError: a stage's predictor structure differs (e.g. ChainOfThought vs Predict).
        """
        for name in self.tuned:
            src, target = getattr(self, name), pipeline_stage(pipeline, name)
            if src is target:
                continue
            a, b = dict(src.named_predictors()), dict(target.named_predictors())
            if a.keys() != b.keys():
                raise ConfigError(f"stage {name!r}: program predictors {sorted(a)} differ from the pipeline's "
                                  f"{sorted(b)}. Fix: build the pipeline with the same predictor class for {name!r}.")
            for key, predictor in b.items():
                lm = predictor.lm
                predictor.load_state({**a[key].dump_state(json_mode=False), "lm": None})
                predictor.lm = lm
        return pipeline


class NarrateProgram(StageProgram):
    """P_nar alone: ``forward(messages) -> Prediction(cue, narrative)`` (inputs exactly as recorded), the narrative
    polished as the pipeline polishes it before storing (``modules.episodic.polish_narrative``: repeats dropped,
    echoes of the demos the program shows dropped, speakers put right) and the cue's speakers put right
    (``polish_cue``). The pipeline's re-ask of an echoed or copied
    reply is not run here: the metric scores an echo or a copy as 0."""

    def __init__(self, pipeline: NemoriPipeline) -> None:
        super().__init__(pipeline, ("narrate",))

    def forward(self, messages: str) -> dspy.Prediction:
        pred = self.call("narrate", messages=messages)
        lines = dated_message_lines(messages)
        narrative = polish_narrative(str(pred.narrative).strip(), lines, demo_texts(self.stage("narrate")))
        return dspy.Prediction(cue=polish_cue(str(pred.cue).strip(), lines), narrative=narrative)


def clean_insights(raw: object, episode_messages: str = "", predicted_episode: str = "",
                   demos: tuple[str, ...] = ()) -> list[str]:
    """P_dis output → distinct non-empty insight strings, bullets stripped, and with the rendered
    ``episode_messages`` questions, chat lines, verbatim copies, restatements of ``predicted_episode`` (P_ant's
    prediction) and echoes of the ``demos`` P_dis was shown (``insight_rules.demo_texts``) dropped (as the pipeline
    stores them)."""
    from nemori_dspy.modules.semantic import clean_insights as _clean

    return _clean(raw, episode_messages, predicted=predicted_episode, demos=demos)


class DistillProgram(StageProgram):
    """P_ant → P_dis: ``forward(episode_cue, known_facts, episode_messages, predicted_episode="")``
    → ``Prediction(insights=list[str], predicted_episode=str)``.

    With ``anticipate`` tuned the prediction is made anew from cue + known facts; with only ``distill``
    tuned the recorded prediction (``predicted_episode``) is used, so the anticipation is held fixed.
    """

    def __init__(self, pipeline: NemoriPipeline, tune: tuple[str, ...] = ("distill",)) -> None:
        bad = set(tune) - {"anticipate", "distill"}
        if bad or not tune:
            raise ConfigError(f"DistillProgram tunes 'anticipate' and/or 'distill', got {tune}.")
        super().__init__(pipeline, tuple(tune), tuple(s for s in ("anticipate", "distill") if s not in tune))

    def forward(self, episode_cue: str, known_facts: list[str], episode_messages: str,
                predicted_episode: str = "") -> dspy.Prediction:
        if "anticipate" in self.tuned or not predicted_episode:  # the pipeline's rule (no facts → no P_ant call)
            predicted_episode = predict_episode(lambda **kw: self.call("anticipate", **kw), self._settings.value,
                                                episode_cue, list(known_facts))
        found = self.call("distill", episode_messages=episode_messages, predicted_episode=predicted_episode).insights
        return dspy.Prediction(insights=clean_insights(found, episode_messages, predicted_episode,
                                                       demo_texts(self.stage("distill"))),
                               predicted_episode=predicted_episode)


class ConsolidateProgram(StageProgram):
    """P_con alone: ``forward(insight, existing_entries) -> Prediction(action, targets, merged_text)``, the reply
    settled as the pipeline settles it before storing (``modules.semantic.settle_decision``): targets out of range
    are dropped, merge/conflict without a target and merge without text become ``new``, and so does a merge the
    pipeline's merge checks refuse (``merge_refusal``: it drops what a source states, changes a quote, only strings
    the sources together; the person check needs the episode's speakers, which a labelled case has not, so it passes).
    The metric therefore scores what memory would hold, not the raw reply."""

    def __init__(self, pipeline: NemoriPipeline) -> None:
        super().__init__(pipeline, ("consolidate",))

    def forward(self, insight: str, existing_entries: str) -> dspy.Prediction:
        d = self.call("consolidate", insight=insight, existing_entries=existing_entries)
        entries = [strip_fact_date(t) for t in entry_texts(existing_entries)]
        numbers = [i for i in sorted(set(target_numbers(d.targets))) if 1 <= i <= len(entries)]
        action, targets, merged, _ = settle_decision(str(d.action), numbers, d.merged_text, strip_fact_date(insight),
                                                     [entries[i - 1] for i in numbers], set())
        return dspy.Prediction(action=action, targets=targets, merged_text=merged)


class EndToEndProgram(StageProgram):
    """Construction stages tuned end to end: ``forward(sample_id) -> Prediction(answers=list[str])``.

    Each call rebuilds the conversation's memory from scratch in a temporary SQLite store with *this
    program's* stage predictors (the candidate an optimizer is trying), then answers the conversation's
    questions through the pipeline's one answer path. Costly — a full construction per example per trial —
    and the only honest score for stages like ``partition`` whose effect shows only downstream.

    Args:
        pipeline: the pipeline whose predictors are tuned (its store is not touched).
        tune: construction stage names to tune (e.g. ``("partition", "narrate")``).
        conversations: ``sample_id`` → LoCoMo conversation (already sliced).
        embedder / settings: as the pipeline's (the rebuilt memory must be built like the real one).
    """

    def __init__(self, pipeline: NemoriPipeline, tune: tuple[str, ...], conversations: dict[str, Any],
                 embedder: Any, settings: Any) -> None:
        super().__init__(pipeline, tuple(tune), ("answer",) if "answer" not in tune else ())
        self._env = _Shared({"conversations": conversations, "embedder": embedder, "settings": settings})

    def forward(self, sample_id: str) -> dspy.Prediction:
        import tempfile
        from pathlib import Path

        from nemori_dspy.eval.runner import ingest_conversation
        from nemori_dspy.memory import Memory
        from nemori_dspy.modules.pipeline import stage_factory
        from nemori_dspy.modules.resources import Resources
        from nemori_dspy.store.sqlite import SQLiteStore

        env = self._env.value
        conv = env["conversations"][sample_id]
        with tempfile.TemporaryDirectory() as tmp:
            store = SQLiteStore(Path(tmp) / "e2e.sqlite3")
            try:
                candidate = NemoriPipeline(Resources(store, env["embedder"], env["settings"]),
                                           stage_factory(env["settings"], {}))
                for name in self.tuned:  # the candidate's predictors build the memory
                    owner, _, attr = PIPELINE_PATHS[name].rpartition(".")
                    setattr(pipeline_stage_owner(candidate, owner), attr, getattr(self, name))
                memory = Memory(store, env["embedder"], env["settings"], pipeline=candidate)
                ingest_conversation(memory, conv, progress=False)
                answers = []
                for q in end_to_end_questions(conv):  # the one answer-context path, then P_ans
                    ctx = candidate.response.context(sample_id, q.question)
                    answers.append(str(self.call("answer", context=ctx.context, question=q.question).answer).strip())
            finally:
                store.close()
        return dspy.Prediction(answers=answers)


def end_to_end_questions(conv: Any) -> list[Any]:
    """The questions an end-to-end example scores: categories 1-4 with a gold answer, in file order."""
    from nemori_dspy.eval.locomo import SCORED_CATEGORIES

    return [q for q in conv.questions if q.category in SCORED_CATEGORIES and q.answer]
