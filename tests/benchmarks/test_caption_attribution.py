"""benchmarks.caption_attribution on the synthetic LoCoMo fixture (one image turn of Ada's)."""

from __future__ import annotations


from benchmarks import caption_attribution as ca
from nemori_dspy.eval.locomo import load_locomo
from tests.fakes import SYNTHETIC_LOCOMO as DATA



def test_each_image_turn_gives_the_sharers_fact_and_the_other_speakers():
    conv = load_locomo(DATA)[0]
    facts = ca.image_facts(conv.messages)
    assert [(right, wrong) for right, wrong, _ in facts] == [
        ("Ada shared an image of a grey cat sleeping on a sofa.", "Ben shared an image of a grey cat sleeping on a sofa.")]


def test_both_named_the_fact_ends_with_the_other_speaker():
    conv = load_locomo(DATA)[0]
    assert [(right, wrong) for right, wrong, _ in ca.image_facts(conv.messages, both_named=True)] == [
        ("Ada shared an image of a grey cat sleeping on a sofa with Ben.",
         "Ben shared an image of a grey cat sleeping on a sofa with Ada.")]


def test_the_rule_puts_the_wrong_sharer_right_and_keeps_the_right_one(capsys):
    assert ca.main(["--data", str(DATA)]) == {"images": 1, "wrong_put_right": 1, "right_kept": 1,
                                               "both_named_images": 1, "both_named_wrong_put_right": 1,
                                               "both_named_right_kept": 1}
    out = capsys.readouterr().out
    assert "| <A> shared an image of … | 1 | 1 | 1 |" in out and "| <A> shared an image of … with <B> | 1 | 1 | 1 |" in out
