"""Lenient adapters: "nothing" replies to a flat list field parse as [], prompts are unchanged."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.adapters import LenientChatAdapter, LenientJSONAdapter, is_empty_reply, make_adapter, prose_items
from nemori_dspy.adapters import single_quoted_items
from nemori_dspy.config import NemoriSettings
from nemori_dspy.modules.pipeline import stage_factory
from nemori_dspy.signatures import ConsolidateKnowledge, DistillDirect, DistillPredictionError, signature_hash
from tests.fakes import ScriptedLM, chat_reply, default_responders

EMPTY = ["", "none", "None", "NULL", "null", "N/A", "nothing", "[None]", "[null]", "- none", "No new insights.",
         "'none'", "`[]`", "[ ]"]


@pytest.mark.parametrize("text", EMPTY)
def test_empty_like_replies_are_recognised(text):
    assert is_empty_reply(text)


@pytest.mark.parametrize("text", ["Caroline has none.", "Caroline adopted a dog.", "['Caroline adopted a dog.']",
                                  "none of them", "nobody"])
def test_statements_are_not_empty(text):
    assert not is_empty_reply(text)


def _insights(reply: str, sig=DistillPredictionError) -> tuple[object, ScriptedLM]:
    responders = default_responders()
    responders[sig.__name__] = lambda i: f"[[ ## insights ## ]]\n{reply}\n\n[[ ## completed ## ]]"
    lm = ScriptedLM(responders)
    inputs = ({"episode_messages": "[2023-05-08 13:00] Caroline: hi", "predicted_episode": "They talked."}
              if sig is DistillPredictionError else {"episode_messages": "[2023-05-08 13:00] Caroline: hi"})
    with dspy.context(lm=lm, adapter=LenientChatAdapter()):
        return dspy.Predict(sig)(**inputs).insights, lm


@pytest.mark.parametrize("reply", EMPTY)
@pytest.mark.parametrize("sig", [DistillPredictionError, DistillDirect])
def test_a_nothing_reply_of_p_dis_is_an_empty_list_in_one_call(reply, sig):
    got, lm = _insights(reply, sig)
    assert got == [] and lm.calls == {sig.__name__: 1}  # no JSON-adapter fallback call


def test_real_insights_are_untouched_and_a_prose_reply_is_its_sentences():
    assert _insights('["Caroline adopted a dog."]')[0] == ["Caroline adopted a dog."]
    got, lm = _insights("Caroline adopted a dog.")  # DSPy's parse would fail and cost a JSON-adapter call
    assert got == ["Caroline adopted a dog."] and lm.calls == {"DistillPredictionError": 1}


def test_p_con_targets_none_is_an_empty_list():
    lm = ScriptedLM({**default_responders(), "ConsolidateKnowledge": lambda i: chat_reply(
        action="new", targets="none", merged_text="")})
    with dspy.context(lm=lm, adapter=LenientChatAdapter()):
        d = dspy.Predict(ConsolidateKnowledge)(insight="Bob lives in Berlin.", existing_entries="[1] Bob moved.")
    assert d.targets == [] and lm.calls == {"ConsolidateKnowledge": 1}


def test_the_json_adapter_reads_null_insights_as_empty():
    sig = DistillPredictionError
    assert LenientJSONAdapter().parse(sig, '{"insights": null}') == {"insights": []}
    assert LenientJSONAdapter().parse(sig, '{"insights": "none"}') == {"insights": []}
    assert LenientJSONAdapter().parse(sig, '{"insights": ["a"]}') == {"insights": ["a"]}
    assert LenientJSONAdapter().parse(sig, '{"insights": "Caroline adopted Rex, a beagle. Melanie paints."}') == {
        "insights": ["Caroline adopted Rex, a beagle.", "Melanie paints."]}
    with pytest.raises(Exception):
        LenientJSONAdapter().parse(sig, '{"insights": 7}')


@pytest.mark.parametrize("sig", [DistillPredictionError, DistillDirect, ConsolidateKnowledge])
def test_the_rendered_prompt_and_signature_hash_are_dspys(sig):
    inputs = {name: "x" for name in sig.input_fields}
    for plain, lenient in ((dspy.ChatAdapter(), LenientChatAdapter()), (dspy.JSONAdapter(), LenientJSONAdapter())):
        assert lenient.format(sig, [], inputs) == plain.format(sig, [], inputs)
    assert {signature_hash(DistillPredictionError), signature_hash(DistillDirect)} == {"58409c8aed46",
                                                                                       "67defc432c5c"}


def test_the_setting_picks_the_adapter():
    assert type(make_adapter("chat")) is LenientChatAdapter and type(make_adapter("json")) is LenientJSONAdapter


def test_a_nothing_reply_through_the_stage_costs_no_retry(ledger):
    responders = default_responders()
    responders["DistillPredictionError"] = lambda i: "[[ ## insights ## ]]\nNone\n\n[[ ## completed ## ]]"
    lm = ScriptedLM(responders)
    stage = stage_factory(NemoriSettings())("distill")
    with dspy.context(lm=lm, adapter=LenientChatAdapter()):
        assert stage(episode_messages="m", predicted_episode="p").insights == []
    assert ledger.counters.get("retries", 0) == 0 and lm.calls == {"DistillPredictionError": 1}


def _inputs(sig):
    values = {str: "Caroline: hi\nMelanie: {\"a\": 1} – ünïcode", int: 7, list[str]: ["fact one", "fact two"]}
    return {name: values.get(f.annotation, "x") for name, f in sig.input_fields.items()}


def _outputs(sig):
    values = {str: "an answer", int: 3, list[str]: ["a", "b"], list[int]: [1, 2], bool: True}
    return {name: values.get(f.annotation, "new") for name, f in sig.output_fields.items()}


@pytest.mark.parametrize("ours, theirs", [(LenientChatAdapter, dspy.ChatAdapter), (LenientJSONAdapter, dspy.JSONAdapter)])
def test_fast_formatting_renders_dspy_bytes_for_every_signature(ours, theirs):
    """The cached system message and the direct str/int values give DSPy's exact messages (so cache keys and
    prompts are unchanged), on a first call, a cached call, and after the instructions change."""
    from nemori_dspy.signatures import SIGNATURES

    fast, ref = ours(), theirs()
    for sig in SIGNATURES.values():
        demos = [dspy.Example(**_inputs(sig), **_outputs(sig))]
        for s in (sig, sig, sig.with_instructions("Tuned: " + sig.instructions)):
            assert fast.format(s, demos, _inputs(s)) == ref.format(s, demos, _inputs(s)), sig.__name__


def test_system_message_follows_instructions_changed_in_place():
    adapter, sig = LenientChatAdapter(), DistillDirect.with_instructions("First.")
    first = adapter.format_system_message(sig)
    sig.instructions = "Second."
    assert "Second." in adapter.format_system_message(sig) and first != adapter.format_system_message(sig)


@pytest.mark.parametrize("reply", [
    "[Caroline adopted a dog.]\n[Caroline walks Rex daily.]",
    "- Caroline adopted a dog.\n- Caroline walks Rex daily.",
    "1. Caroline adopted a dog.\n2. Caroline walks Rex daily.",
    "[Caroline adopted a dog.]\n[Caroline walks Rex daily.",  # the last line cut before its bracket
])
def test_a_list_written_one_item_per_line_is_that_list_in_one_call(reply):
    got, lm = _insights(reply)
    assert got == ["Caroline adopted a dog.", "Caroline walks Rex daily."] and lm.calls == {"DistillPredictionError": 1}


def test_an_item_holding_brackets_keeps_them():
    got, _ = _insights("[Caroline shared a photo [a dog by a wall].]\n[Melanie paints.]")
    assert got == ["Caroline shared a photo [a dog by a wall].", "Melanie paints."]


def test_a_json_list_over_several_lines_is_dspys_to_parse():
    assert _insights('[\n  "Caroline adopted a dog.",\n  "Melanie paints."\n]')[0] == [
        "Caroline adopted a dog.", "Melanie paints."]


# ---------------------------------------------------------------- a list reply is never split at commas in a sentence
@pytest.mark.parametrize("reply, items", [
    # the 0.5B model's bracketed line of unquoted items: json_repair alone splits it at every comma
    ("[Caroline likes reading, but when I look after myself, I feel better since we last chatted.]",
     ["Caroline likes reading, but when I look after myself, I feel better since we last chatted."]),
    ("[Caroline adopted Rex, a beagle., Melanie paints, draws and sings.]",
     ["Caroline adopted Rex, a beagle.", "Melanie paints, draws and sings."]),
    ("[The prediction missed Gina's identity, relationships, preferences and plans]",
     ["The prediction missed Gina's identity, relationships, preferences and plans"]),
    # plain prose: its sentences (not a parse error), an abbreviation does not end one
    ("Caroline adopted Rex, a beagle, on 8 May 2023. Melanie visited Dr. Hill, her dentist!",
     ["Caroline adopted Rex, a beagle, on 8 May 2023.", "Melanie visited Dr. Hill, her dentist!"]),
    ("Here are the facts:\nCaroline adopted Rex, a beagle.\nMelanie paints, mostly at night.",
     ["Caroline adopted Rex, a beagle.", "Melanie paints, mostly at night."]),
    ("[\n  Caroline adopted Rex, a beagle.\n  Melanie paints, mostly at night.\n]",
     ["Caroline adopted Rex, a beagle.", "Melanie paints, mostly at night."]),
])
def test_a_prose_list_reply_becomes_its_sentences_not_its_comma_pieces(reply, items):
    got, lm = _insights(reply)
    assert got == items and lm.calls == {"DistillPredictionError": 1}


def test_a_quoted_json_list_keeps_its_items_commas_and_all():
    got, _ = _insights("['Caroline adopted Rex, a beagle, in May 2023.', 'Melanie paints.']")
    assert got == ["Caroline adopted Rex, a beagle, in May 2023.", "Melanie paints."]


@pytest.mark.parametrize("reply, items", [
    # conv-49, 2026-12-04: json_repair read each apostrophe as a quote ("s cherished memories", "Evan", ...)
    ("['Evan and Sam reminisce about their family's cherished memories, particularly a collage.', "
     "'They also talk about Evan's accident, but they suggest a hike.']",
     ["Evan and Sam reminisce about their family's cherished memories, particularly a collage.",
      "They also talk about Evan's accident, but they suggest a hike."]),
    ("['Sam's knee is healing.',\n 'Evan's new Prius broke down.',]", ["Sam's knee is healing.",
                                                                       "Evan's new Prius broke down."]),
])
def test_a_single_quoted_list_is_split_between_items_not_at_apostrophes(reply, items):
    got, lm = _insights(reply)
    assert got == items and lm.calls == {"DistillPredictionError": 1}


@pytest.mark.parametrize("text", ["['Caroline adopted Rex, a beagle.', 'Melanie paints.']", '["Sam\'s dog"]',
                                  "Sam's dog, Evan's car."])
def test_lists_json_repair_reads_right_are_left_to_it(text):
    assert single_quoted_items(text) is None


@pytest.mark.parametrize("text", ["[]", "none", "[None]", '["a, b"]', "```json\n[\"a\"]\n```", ""])
def test_json_lists_and_empty_replies_are_not_prose(text):
    assert prose_items(text) is None
