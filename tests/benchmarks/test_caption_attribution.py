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


def test_the_rule_puts_the_wrong_sharer_right_and_keeps_the_right_one(capsys):
    assert ca.main(["--data", str(DATA)]) == {"images": 1, "wrong_put_right": 1, "right_kept": 1}
    assert "| 1 | 1 | 1 |" in capsys.readouterr().out
