"""Who shared a picture: the speaker-attribution rule (``insight_rules.misattributed_to``) on every LoCoMo image turn,
no LLM.

LoCoMo's image turns reach memory as ``… [shares an image: <caption>]`` (``eval.locomo``); a distiller or narrator
writes "Caroline shares an image of a waterfall" of Melanie's picture. For every image turn of a session with two
speakers this builds the fact "<speaker> shared an image of <caption>" twice, once with the speaker who shared it
and once with the other, and asks ``insight_rules.reattribute`` (the P_dis guard) about each on the session's
messages. It prints how many of the wrongly credited facts are put right (recall) and how many of the rightly
credited ones are left alone (they must all be).

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


def image_facts(messages: list) -> list[tuple[str, str, list]]:
    """``(right, wrong, lines)`` per image turn of ``messages`` (one conversation) in sessions of two speakers:
    the fact crediting the sharer, the same fact crediting the other speaker, and the session's messages as
    ``insight_rules.SourceLine``."""
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
                out.append((f"{m.speaker} shared an image of {caption}.", f"{other} shared an image of {caption}.",
                            lines))
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

    result = score([f for conv in load_locomo(args.data) for f in image_facts(conv.messages)])
    print(table(["image turns", "wrong speaker put right", "right speaker kept"],
                [[result["images"], result["wrong_put_right"], result["right_kept"]]]))
    return result


if __name__ == "__main__":
    main()
