"""Every prompt is a typed signature: docstring instruction, typed fields with descriptions, stable hash."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.signatures import SIGNATURES, NarrateEpisode, signature_hash

MESSAGE_FIELDS = {"messages", "episode_messages"}


@pytest.mark.parametrize("stage", sorted(SIGNATURES))
def test_signature_is_typed_and_documented(stage):
    sig = SIGNATURES[stage]
    assert len(sig.instructions) > 80
    for name, field in sig.model_fields.items():
        extra = field.json_schema_extra or {}
        assert extra.get("desc"), f"{stage}.{name} has no desc"
        assert field.annotation is not None


@pytest.mark.parametrize("stage", ["partition", "narrate", "distill", "direct_distill"])
def test_signatures_that_see_messages_are_told_about_timestamps(stage):
    sig = SIGNATURES[stage]
    fields = [f for n, f in sig.model_fields.items() if n in MESSAGE_FIELDS]
    assert fields and all("YYYY-MM-DD" in (f.json_schema_extra or {}).get("desc", "") for f in fields)


def test_narration_and_distillation_ask_for_absolute_dates():
    for stage in ("narrate", "distill", "direct_distill"):
        assert "absolute" in SIGNATURES[stage].instructions.lower()


def test_hash_changes_when_the_instruction_changes():
    reworded = NarrateEpisode.with_instructions(NarrateEpisode.instructions + " Be brief.")
    assert issubclass(reworded, dspy.Signature)
    assert signature_hash(reworded) != signature_hash(NarrateEpisode)


def test_hash_changes_when_a_field_changes():
    base = signature_hash(NarrateEpisode)
    redescribed = NarrateEpisode.with_updated_fields("narrative", desc="one sentence")
    retyped = NarrateEpisode.with_updated_fields("narrative", type_=list[str])
    extra = NarrateEpisode.append("mood", dspy.OutputField(desc="the speakers' mood"), type_=str)
    assert len({base, signature_hash(redescribed), signature_hash(retyped), signature_hash(extra)}) == 4


def test_hash_depends_on_the_prompt_text_only():
    """A separately built class with the same instruction and fields (another name, another object) hashes the
    same, so a construction cache key survives a refactor that does not change what the model reads."""
    copy = NarrateEpisode.with_instructions(NarrateEpisode.instructions)
    assert copy is not NarrateEpisode and signature_hash(copy) == signature_hash(NarrateEpisode)
    renamed = type("RenamedNarrate", (NarrateEpisode,), {"__doc__": NarrateEpisode.instructions})
    assert signature_hash(renamed) == signature_hash(NarrateEpisode)


def test_every_prompt_hashes_apart():
    assert len({signature_hash(sig) for sig in SIGNATURES.values()}) == len(set(SIGNATURES.values()))


def test_no_prompt_quotes_benchmark_content():
    """Examples in instructions must not leak LoCoMo answers (a no-memory control would get them free)."""
    for stage, sig in SIGNATURES.items():
        from nemori_dspy.signatures import signature_text

        text = signature_text(sig)
        for leak in ("Caroline", "Melanie", "May 2023", "2023-05", "pottery", "camping", "LGBTQ"):
            assert leak not in text, f"{stage} mentions {leak!r}"
