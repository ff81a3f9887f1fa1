"""junk.junk_reason / is_fragment on the junk the 0.5B model stored (issue 19) and on real facts that must pass."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.junk import JUNK_REASONS, is_fragment, junk_reason, reference_phrases
from nemori_dspy.modules.semantic import NOTHING_PREDICTED

REAL_FACTS = [
    "Caroline went to an LGBTQ support group on 7 May 2023.",
    "Melanie painted a lake sunrise in 2022.",
    "Gina lost her job at Door Dash in January 2023 and plans to open a dance studio.",
    "Jon's plans include opening a dance studio.",
    "Caroline prefers hiking over running.",
    "No one came to Caroline's party.",
    "Sam said on 2023-09-15 that he quit the bakery.",
    "Noor and Sam booked the ferry on 11 May 2023.",
]


@pytest.mark.parametrize("text", [
    "A faithful third-person account of what happened and what was said, naming the speakers ... Do not invent facts.",
    "relationships", "preferences", "plans", "The prediction missed the following facts: Gina's identity",
    "identity, relationships, events with absolute dates",
])
def test_echoes_of_instructions_are_junk(text):
    assert junk_reason(text) in ("instruction_echo", "field_description_echo")


def test_a_field_description_echo_is_named_as_such():
    assert junk_reason("third-person narrative with absolute dates, 2-6 sentences") == "field_description_echo"
    assert junk_reason("Episodic cue: one-line title with who, what and the absolute date.") == "field_description_echo"


@pytest.mark.parametrize("text", [NOTHING_PREDICTED, "(none)", "N/A", "no information about these people yet",
                                  "nothing", "[]", "  ", "None.", "No new facts."])
def test_placeholders(text):
    assert junk_reason(text) == "placeholder"


@pytest.mark.parametrize("text", REAL_FACTS)
def test_real_facts_are_not_junk(text):
    assert junk_reason(text) is None


def test_a_narrative_mostly_made_of_instruction_sentences_is_junk_one_real_sentence_is_not_enough():
    echo = ("Write the cue: a short title naming who did what, and when. Convert every relative time expression into "
            "an absolute date using the message timestamps. Noor went to a pottery class.")
    assert junk_reason(echo) == "instruction_echo"
    real = "Noor told Elias about her pottery class on 1 April 2023. She made four bowls. Ingrid teaches her."
    assert junk_reason(real) is None


def test_a_tuned_instruction_is_matched_when_its_signature_is_passed():
    tuned = dspy.Signature("messages -> facts", "Carefully enumerate the durable personal knowledge shown here")
    text = "carefully enumerate the durable personal knowledge shown here"
    assert junk_reason(text) is None
    assert junk_reason(text, signatures=[tuned]) == "instruction_echo"
    assert any("durable personal knowledge" in p for p in reference_phrases([tuned])["instruction_echo"])


def test_reasons_are_the_documented_ones():
    assert set(JUNK_REASONS) == {"instruction_echo", "field_description_echo", "placeholder"}


@pytest.mark.parametrize("text", ["reading", "but when I look after myself", "since we last chatted", "relationships",
                                  "Gina's identity", "the new puppy from the shelter", "and because she was tired",
                                  # a list split at apostrophes (conv-49, nemori-paper, 2026-12-04)
                                  "s cherished memories", "s marriage is special", "t know what to do next"])
def test_fragments(text):
    assert is_fragment(text)


@pytest.mark.parametrize("text", [*REAL_FACTS, "When Caroline was 10, she moved to Sweden.",
                                  "On 7 May 2023 Caroline went to a support group.",
                                  "Since 2020 Caroline has lived in Sweden.", "The kids enjoy camping.",
                                  "Caroline adores pottery.", "Pepper steals socks at night."])
def test_sentences_are_not_fragments(text):
    assert not is_fragment(text)


def test_drop_repeated_sentences_keeps_first_occurrences_in_order():
    from nemori_dspy.junk import drop_repeated_sentences

    assert drop_repeated_sentences("A cat sat. The dog ran! a CAT sat.") == ("A cat sat. The dog ran!", 1)
    text = "Nothing repeats here. Not even this."
    assert drop_repeated_sentences(text) == (text, 0)
    assert drop_repeated_sentences("One. Two. One. Two. Thr") == ("One. Two.", 3)
