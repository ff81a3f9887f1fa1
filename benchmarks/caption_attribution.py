"""Who shared a picture: the speaker-attribution rule (``insight_rules.misattributed_to``) on every LoCoMo image turn,
no LLM.

LoCoMo's image turns reach memory as ``… [shares an image: <caption>]`` (``eval.locomo``); a distiller or narrator
writes "Caroline shares an image of a waterfall" of Melanie's picture. For every image turn of a session with two
speakers this builds the fact "<speaker> shared an image of <caption>" twice, once with the speaker who shared it
and once with the other, and asks ``insight_rules.reattribute`` (the P_dis guard) about each on the session's
messages; then the same with both named ("<speaker> shared an image of <caption> with <other>" and the names the
other way round). It prints how many of the wrongly credited facts are put right (recall) and how many of the
rightly credited ones are left alone (they must all be), per form.

usage: python -m benchmarks.caption_attribution --data ../shared/data/locomo/locomo10.json
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

__all__ = ["CAPTION", "image_facts", "score", "main"]

#: an image turn as ``eval.locomo`` renders it; the caption without its "a photo of" opening in group 1.
CAPTION = re.compile(r"\[shares an image: (?:(?:a|an) (?:photo|picture|photography|image) of )?([^\]]*)\]")


def image_facts(messages: list, both_named: bool = False) -> list[tuple[str, str, list]]:
    """``(right, wrong, lines)`` per image turn of ``messages`` (one conversation) in sessions of two speakers:
    the fact crediting the sharer, the same fact crediting the other speaker, and the session's messages as
    ``insight_rules.SourceLine``. ``both_named``: the facts end "with <the other one>"."""
    from nemori_dspy.insight_rules import source_lines

    sessions: dict[str, list] = defaultdict(list)
    for m in messages:
        sessions[m.id.split(":")[0]].append(m)
    out = []
    for msgs in sessions.values():
        speakers = sorted({m.speaker for m in msgs})
        if len(speakers) != 2:
            continue
        lines = source_lines(msgs)
        for m in msgs:
            if hit := CAPTION.search(m.content):
                other = speakers[1] if m.speaker == speakers[0] else speakers[0]
                caption = hit.group(1).strip().rstrip(".")
                tail, wrong_tail = (f" with {other}", f" with {m.speaker}") if both_named else ("", "")
                out.append((f"{m.speaker} shared an image of {caption}{tail}.",
                            f"{other} shared an image of {caption}{wrong_tail}.", lines))
    return out


def score(facts: list[tuple[str, str, list]]) -> dict[str, int]:
    """``{"images", "wrong_put_right", "right_kept"}``: counts over ``image_facts``' triples."""
    from nemori_dspy.insight_rules import reattribute

    fixed = sum(reattribute(wrong, lines) == (right, True) for right, wrong, lines in facts)
    kept = sum(not reattribute(right, lines)[1] for right, _, lines in facts)
    return {"images": len(facts), "wrong_put_right": fixed, "right_kept": kept}


def main(argv: list[str] | None = None) -> dict[str, int]:
    """Print and return ``score`` over every conversation of ``--data``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="locomo10.json or a file in its schema")
    args = ap.parse_args(argv)
    from benchmarks.results_io import table
    from nemori_dspy.eval.locomo import load_locomo

    convs = load_locomo(args.data)
    result = score([f for conv in convs for f in image_facts(conv.messages)])
    both = score([f for conv in convs for f in image_facts(conv.messages, both_named=True)])
    print(table(["fact", "image turns", "wrong speaker put right", "right speaker kept"],
                [["<A> shared an image of …", result["images"], result["wrong_put_right"], result["right_kept"]],
                 ["<A> shared an image of … with <B>", both["images"], both["wrong_put_right"], both["right_kept"]]]))
    return {**result, **{f"both_named_{k}": v for k, v in both.items()}}


if __name__ == "__main__":
    main()
