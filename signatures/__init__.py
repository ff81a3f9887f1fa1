"""Typed DSPy signatures, one per Nemori prompt (Appendix D), keyed by stage name in ``SIGNATURES``.

Every instruction is our reconstruction: the paper publishes only the prompts' headings.
"""

from __future__ import annotations

import hashlib
import json

import dspy

from nemori_dspy.stages import STAGE_TABLE
from nemori_dspy.signatures.episodic import (IntegrateEpisodes, NarrateEpisode, NarrateEpisodes, PartitionMessages,
                                             SelectContinuation)
from nemori_dspy.signatures.longmemeval import (
    JudgeLongMemEvalAbstention,
    JudgeLongMemEvalDefault,
    JudgeLongMemEvalKnowledgeUpdate,
    JudgeLongMemEvalPreference,
    JudgeLongMemEvalTemporal,
)
from nemori_dspy.signatures.response import AnswerQuestion, JudgeAnswer, JudgeAnswerStrict
from nemori_dspy.signatures.semantic import (
    AnticipateEpisode,
    ConsolidateKnowledge,
    ConsolidateKnowledgeBatch,
    DistillDirect,
    DistillPredictionError,
    UpdateSummary,
)

__all__ = [
    "PartitionMessages",
    "NarrateEpisode",
    "NarrateEpisodes",
    "SelectContinuation",
    "IntegrateEpisodes",
    "AnticipateEpisode",
    "DistillPredictionError",
    "ConsolidateKnowledge",
    "ConsolidateKnowledgeBatch",
    "DistillDirect",
    "UpdateSummary",
    "AnswerQuestion",
    "JudgeAnswer",
    "JudgeAnswerStrict",
    "JudgeLongMemEvalDefault",
    "JudgeLongMemEvalTemporal",
    "JudgeLongMemEvalKnowledgeUpdate",
    "JudgeLongMemEvalPreference",
    "JudgeLongMemEvalAbstention",
    "SIGNATURES",
    "JUDGE_VARIANTS",
    "signature_hash",
    "signature_text",
]

#: signatures the LoCoMo and LongMemEval judges run besides the ``judge`` stage's: ``judge_strict`` is our
#: stricter LoCoMo judge, the judge_lme_* are the LongMemEval_S per-type judges (Appendix D.4.2).
JUDGE_VARIANTS: dict[str, type[dspy.Signature]] = {
    "judge_strict": JudgeAnswerStrict,
    "judge_lme_default": JudgeLongMemEvalDefault,
    "judge_lme_temporal": JudgeLongMemEvalTemporal,
    "judge_lme_knowledge_update": JudgeLongMemEvalKnowledgeUpdate,
    "judge_lme_preference": JudgeLongMemEvalPreference,
    "judge_lme_abstention": JudgeLongMemEvalAbstention,
}

#: stage name → signature class: every stage of ``nemori_dspy.stages.STAGE_TABLE`` (its ``signature`` names the
#: class), then the ``JUDGE_VARIANTS``.
SIGNATURES: dict[str, type[dspy.Signature]] = {
    **{s.name: globals()[s.signature] for s in STAGE_TABLE},
    **JUDGE_VARIANTS,
}


def signature_text(sig: type[dspy.Signature]) -> str:
    """The full prompt-defining text of a signature: instruction plus every field's name, type and desc."""
    fields = {
        name: {"type": str(f.annotation), "desc": (f.json_schema_extra or {}).get("desc"),
               "io": (f.json_schema_extra or {}).get("__dspy_field_type")}
        for name, f in sig.model_fields.items()
    }
    return json.dumps({"instructions": sig.instructions, "fields": fields}, sort_keys=True)


def signature_hash(sig: type[dspy.Signature]) -> str:
    """sha256 (first 12 hex chars) of ``signature_text``: a reworded prompt gets a new hash."""
    return hashlib.sha256(signature_text(sig).encode()).hexdigest()[:12]
