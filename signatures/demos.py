"""Seed demonstrations: one or two hand-written worked examples per construction prompt (our addition).

The paper's prompts are zero-shot (Appendix D). A small local model given only the instruction echoes a field
description back or copies a chat line as the narrative; one worked example of the reply it should write fixes
the format far more cheaply than a larger model (docs/decisions.md). The people and events here are
invented for this project (no LoCoMo text). They are ordinary DSPy demos (``predictor.demos``): an optimizer
replaces them, ``save()`` writes them, and ``seed_demos=False`` (the paper's value) leaves every stage zero-shot.

Messages are shown in the ``message_timestamps="on_change"`` layout with ``resolve_relative_dates`` notes, as the
pipeline renders them (``nemori_dspy.formatting.render_messages``).
"""

from __future__ import annotations

import dspy

__all__ = ["SEED_DEMOS", "seed_demos"]

_MESSAGES = (
    "[2022-03-14 18:20]\n"
    "Priya: Hi Tom! Guess what, I adopted a rescue greyhound on 12 March 2022 (last Saturday). His name is Biscuit.\n"
    "Tom: No way, congrats! How is he settling in?\n"
    "Priya: Pretty well. He sleeps most of the day, but he's scared of the stairs.\n"
    "Tom: My sister had the same problem with hers. She put a treat on every step.\n"
    "Priya: Good idea, I'll try that. Also, I'm starting a pottery class in April 2022 (next month)!\n"
    "Tom: Nice! I still can't get my bike fixed, the shop says two more weeks.")

_CUE = "Priya tells Tom about adopting her rescue greyhound Biscuit (14 March 2022)"
_NARRATIVE = (
    "On 14 March 2022 Priya told Tom that she had adopted a rescue greyhound named Biscuit on 12 March 2022. "
    "She said Biscuit sleeps most of the day but is scared of the stairs; Tom said his sister's dog had the same "
    "problem and that his sister put a treat on every step, which Priya decided to try. Priya also said she is "
    "starting a pottery class in April 2022. Tom said his bike is still at the repair shop for two more weeks.")

_FACTS = [
    "Priya adopted a rescue greyhound named Biscuit on 12 March 2022.",
    "Priya's greyhound Biscuit is scared of the stairs.",
    "Tom's sister helped her dog with stairs by putting a treat on every step.",
    "Priya is starting a pottery class in April 2022.",
    "Tom's bike was at a repair shop in March 2022.",
]

_KNOWN = ["(2022-02-20) Priya wants to adopt a dog.", "(2022-02-20) Tom cycles to work."]
_PREDICTED = ("Priya tells Tom that she has been looking for a dog to adopt, and Tom mentions cycling to work.")


def _ex(**fields: object) -> dspy.Example:
    return dspy.Example(**fields)


#: stage name → its seed demos (``dspy.Example`` with the signature's input and output fields).
SEED_DEMOS: dict[str, list[dspy.Example]] = {
    "narrate": [_ex(messages=_MESSAGES, cue=_CUE, narrative=_NARRATIVE)],
    "anticipate": [_ex(episode_cue="(2022-03-14) Priya tells Tom about adopting her rescue greyhound Biscuit",
                       known_facts=_KNOWN, predicted_episode=_PREDICTED)],
    "distill": [_ex(episode_messages=_MESSAGES, predicted_episode=_PREDICTED, insights=_FACTS)],
    "direct_distill": [_ex(episode_messages=_MESSAGES, insights=_FACTS)],
    "consolidate": [
        _ex(insight="(2022-06-10) Priya moved from Leeds to Bristol in June 2022.",
            existing_entries="[1] (2022-01-05) Priya lives in Leeds.\n[2] (2022-03-14) Priya is starting a pottery "
                             "class in April 2022.",
            action="conflict", targets=[1], merged_text=""),
        # a different person on the same topic is new information: the 1.5B model merged 69 of 90 labelled cases
        # without a demo of "new" (benchmarks/consolidation_batch.py)
        _ex(insight="(2022-07-01) Tom adopted a cat named Miso in June 2022.",
            existing_entries="[1] (2022-03-14) Priya adopted a rescue greyhound named Biscuit in March 2022.\n"
                             "[2] (2022-02-20) Tom cycles to work.",
            action="new", targets=[], merged_text=""),
        _ex(insight="(2022-05-02) Priya's pottery class meets on Thursday evenings.",
            existing_entries="[1] (2022-03-14) Priya is starting a pottery class in April 2022.",
            action="merge", targets=[1],
            merged_text="Priya started a pottery class in April 2022; it meets on Thursday evenings."),
    ],
}


def seed_demos(stage: str) -> list[dspy.Example]:
    """Copies of ``stage``'s seed demos ([] for a stage without any, e.g. ``answer`` or ``judge``)."""
    return [dspy.Example(**d.toDict()) for d in SEED_DEMOS.get(stage, [])]
