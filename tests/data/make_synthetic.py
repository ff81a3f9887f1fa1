"""Write ``synthetic_mini.json``: one conversation in LoCoMo's schema, written for this project.

The end-to-end tests (eval runner, CLI, crash, fault injection) need a conversation the size of LoCoMo's
``locomo_mini.json`` — three sessions days apart, 56 turns, 25 QA items — without LoCoMo's text (it is
CC BY-NC and not in this repository). Every line below was written for nemori-dspy. The file carries the
schema's quirks the loader handles:

- ``session_N`` / ``session_N_date_time`` keys ("10:15 am on 3 April, 2023"); every turn takes its
  session's date-time; sessions 18 and 21 days apart (so a window straddling them is cut at the gap);
- image turns with ``img_url``, ``blip_caption`` and ``query`` (5 of them);
- relative dates in the text ("on Saturday", "last weekend", "last Sunday", "yesterday");
- integer answers (4, 2019); category-5 items with ``adversarial_answer`` and no ``answer``;
- evidence strings joined by ``;`` or a space, with a leading zero ("D2:08") and malformed pieces
  ("D", "D:1:9") that normalise away;
- ``observation`` (``session_N_observation`` → {speaker: [[fact, dia_id], ...]}, a dia_id sometimes a list, one
  that resolves to no turn) and ``session_summary`` (``session_N_summary`` → text), as LoCoMo's annotations
  (the memory-quality metrics, ``eval/memory_quality.py``, read them).

The output is deterministic (fixed content and key order, ``indent=2``, trailing newline);
``tests/eval/test_locomo.py`` checks that the committed JSON equals what this script writes.

usage: python tests/data/make_synthetic.py [OUT]   (default: synthetic_mini.json beside this script)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["SAMPLE_ID", "build", "render", "main"]

SAMPLE_ID = "synth-1"
A, B = "Noor", "Elias"
OUT = Path(__file__).with_name("synthetic_mini.json")

# (speaker, text) or (speaker, text, blip_caption, query) per turn; dia_id = D<session>:<position>
SESSIONS: list[tuple[str, list[tuple[str, ...]]]] = [
    ("10:15 am on 3 April, 2023", [  # a Monday
        (A, "Morning, Elias! I finally went to my first pottery class on Saturday."),
        (B, "Nice! How did it go? I've been meaning to ask since you mentioned signing up."),
        (A, "Messy but wonderful. I made four lopsided bowls and one of them actually holds water."),
        (B, "Four on your first try is impressive. Who teaches the class?"),
        (A, "A retired chemist named Ingrid. She mixes her own glazes."),
        (B, "That sounds like the right kind of teacher. I've been busy in the workshop myself."),
        (B, "Here's the workbench I just finished.",
         "a photo of a wooden workbench in a garage with tools hanging on the wall", "oak workbench garage"),
        (A, "Wow, is that solid oak? You built boats before, didn't you?"),
        (B, "Yes, my first one was a small rowing boat back in 2019. It still floats!"),
        (A, "Ha, better than my bowls. How is the triathlon training going?"),
        (B, "Slowly. Swimming is my weak spot, so I go to the lake pool three mornings a week."),
        (A, "The night shifts at the hospital make it hard for me to keep any routine like that."),
        (B, "Are you still on the children's ward?"),
        (A, "Yes, four years now. The kids keep me going, even on long nights."),
        (B, "You should be proud. What made you pick up pottery?"),
        (A, "I wanted something for my hands that has nothing to do with screens or charts."),
        (A, "This is the bowl that holds water.",
         "a photo of a small blue ceramic bowl on a wooden table", "handmade blue bowl"),
        (B, "The blue is lovely. Keep it for your keys."),
        (A, "Good idea. Talk soon, and good luck in the water!"),
    ]),
    ("7:40 pm on 21 April, 2023", [  # a Friday, 18 days later
        (B, "Hey Noor! Big news: we adopted a rescue dog last weekend."),
        (A, "No way! What kind of dog?"),
        (B, "A three-legged greyhound mix called Pepper. She was at the shelter for eight months."),
        (A, "Poor thing. I'm glad she found you. How is she settling in?"),
        (B, "She sleeps most of the day and steals socks at night.",
         "a photo of a grey dog lying on a couch next to a sock", "dog couch sock"),
        (A, "She looks so peaceful. I have news too: I'm planning a trip to Norway in August."),
        (B, "Norway! Where exactly?"),
        (A, "Tromsø first, then a ferry down the coast to Bergen. My cousin Leila lives in Bergen."),
        (B, "That coast is supposed to be stunning. Are you going alone?"),
        (A, "With my friend Sam from the ward. We've wanted to travel together since nursing school."),
        (B, "Sounds perfect. Did you keep going with pottery?"),
        (A, "Every Saturday. Ingrid says I'm ready to try the wheel instead of hand-building."),
        (B, "Progress! I signed up for the Lakeside Sprint Triathlon in early May."),
        (A, "How far is the swim?"),
        (B, "750 metres, then 20 km on the bike and a 5 km run."),
        (A, "You'll be fine. Pepper can be your cheering squad."),
        (B, "She'd rather chase the ducks. Have a good shift tonight!"),
    ]),
    ("4:30 pm on 12 May, 2023", [  # a Friday, 21 days later
        (A, "Elias! How was the triathlon?"),
        (B, "I finished it last Sunday! One hour and twenty-four minutes."),
        (A, "That's amazing. Was the swim as bad as you feared?"),
        (B, "Worse at the start, everyone kicking, but I found my rhythm after the first buoy."),
        (B, "My sister took this at the finish line.",
         "a photo of a man in a wetsuit holding a medal next to a lake", "triathlon finish medal"),
        (A, "You look exhausted and happy. Was your sister visiting?"),
        (B, "Yes, Marta flew in from Porto for the weekend. She hadn't met Pepper yet."),
        (A, "Did Pepper approve of her?"),
        (B, "Instantly. She slept on Marta's suitcase the whole weekend."),
        (A, "Ha! I tried the wheel on Saturday, by the way."),
        (A, "My first cylinder. It leans a bit.",
         "a photo of a tall clay cylinder on a pottery wheel", "clay cylinder wheel"),
        (B, "Leaning is character. Is Ingrid still teaching you?"),
        (A, "She is, and she asked me to help at the studio's open day in June."),
        (B, "That's an honour. How are the Norway plans?"),
        (A, "We booked the ferry yesterday. Sam wants to see the northern lights, but in August it's too bright."),
        (B, "Midnight sun instead, then. Take lots of pictures."),
        (A, "I will. I also switched to day shifts starting in June, so I'll finally sleep at night."),
        (B, "Great news. Maybe you can join Pepper and me for morning walks."),
        (A, "I'd love that. Give Pepper a scratch from me."),
        (B, "Will do. Talk soon!"),
    ]),
]

# (question, answer, evidence as the file writes it, category); answer None = category 5 (adversarial_answer)
QA: list[tuple[str, Any, list[str], int, str | None]] = [
    ("Who teaches Noor's pottery class?", "Ingrid, a retired chemist", ["D1:5"], 4, None),
    ("When did Noor go to her first pottery class?", "1 April 2023", ["D1:1"], 2, None),
    ("In what year did Elias build his first boat?", 2019, ["D1:9"], 2, None),
    ("How many bowls did Noor make in her first pottery class?", 4, ["D1:3"], 4, None),
    ("What hobbies did Noor and Elias pursue in spring 2023?", "pottery and triathlon training",
     ["D1:1", "D1:11"], 1, None),
    ("Which ward does Noor work on?", "the children's ward", ["D1:13 D1:14"], 4, None),
    ("When did Elias adopt Pepper?", "The weekend before 21 April 2023", ["D2:1"], 2, None),
    ("What is the name of Elias's dog?", "Pepper", ["D2:3"], 4, None),
    ("When is Noor travelling to Norway?", "August 2023", ["D2:6"], 2, None),
    ("Where does Noor's cousin Leila live?", "Bergen", ["D2:08"], 4, None),
    ("Would Elias likely enjoy a woodworking course?", "Yes; he builds boats and furniture in his workshop",
     ["D1:7", "D1:9"], 3, None),
    ("How long is the swim in the Lakeside Sprint Triathlon?", "750 metres", ["D2:15"], 4, None),
    ("When did Elias finish the Lakeside Sprint Triathlon?", "7 May 2023", ["D3:2"], 2, None),
    ("Who took the photo of Elias at the finish line?", "his sister Marta", ["D3:5", "D3:7"], 4, None),
    ("Which relatives of Noor and Elias are mentioned?", "Noor's cousin Leila and Elias's sister Marta",
     ["D2:8; D3:7"], 1, None),
    ("When did Noor first try the pottery wheel?", "6 May 2023", ["D3:10; D3:11"], 2, None),
    ("How has Noor's pottery progressed?", "from hand-built bowls to a cylinder thrown on the wheel",
     ["D1:3; D2:12", "D3:11", "D"], 1, None),
    ("How long has Noor worked on the children's ward?", "four years", ["D1:14"], 2, None),
    ("What change to Noor's working hours is mentioned?", "from night shifts to day shifts in June",
     ["D1:12", "D3:17"], 1, None),
    ("Is Noor likely to see the northern lights on her trip?", "No, August nights in northern Norway are too bright",
     ["D3:15"], 3, None),
    ("What is the name of Noor's dog?", None, ["D2:3"], 5, "Pepper"),
    ("Who teaches Elias's pottery class?", None, ["D1:5"], 5, "Ingrid"),
    ("When did Noor finish the Lakeside Sprint Triathlon?", None, ["D3:2"], 5, "7 May 2023"),
    ("Where does Elias's cousin Leila live?", None, ["D2:8"], 5, "Bergen"),
    ("How many boats did Noor build in 2019?", None, ["D1:9", "D:1:9"], 5, "one"),
]


# session → speaker → [fact, dia_id or list of dia_ids]; written for this project in LoCoMo's annotation style
OBSERVATIONS: dict[int, dict[str, list[list[Any]]]] = {
    1: {A: [["Noor went to her first pottery class on the Saturday before 3 April 2023.", "D1:1"],
            ["Noor made four lopsided bowls in her first pottery class, and one of them holds water.", "D1:3"],
            ["Noor's pottery teacher is Ingrid, a retired chemist who mixes her own glazes.", "D1:5"],
            ["Noor works night shifts at the hospital, which makes it hard for her to keep a routine.", "D1:12"],
            ["Noor has worked on the children's ward for four years.", ["D1:13", "D1:14"]],
            ["Noor took up pottery to do something with her hands that has nothing to do with screens.", "D1:16"]],
        B: [["Elias finished building a solid oak workbench in his workshop.", ["D1:6", "D1:7"]],
            ["Elias built his first boat, a small rowing boat, in 2019.", "D1:9"],
            ["Elias is training for a triathlon and swims at the lake pool three mornings a week.", "D1:11"]]},
    2: {B: [["Elias adopted Pepper, a three-legged greyhound mix, from a shelter the weekend before 21 April 2023.",
             "D2:1"],
            ["Pepper had been at the shelter for eight months.", "D2:3"],
            ["Pepper sleeps most of the day and steals socks at night.", "D2:5"],
            ["Elias signed up for the Lakeside Sprint Triathlon in early May 2023.", "D2:13"],
            ["The Lakeside Sprint Triathlon has a 750-metre swim, a 20 km bike ride and a 5 km run.", "D2:15"]],
        A: [["Noor is planning a trip to Norway in August 2023.", "D2:6"],
            ["Noor will go from Tromsø by ferry down the coast to Bergen, where her cousin Leila lives.", "D2:8"],
            ["Noor is travelling with her friend Sam from the ward.", "D2:10"],
            ["Noor goes to pottery every Saturday, and Ingrid says she is ready to try the wheel.", "D2:12"]]},
    3: {B: [["Elias finished the Lakeside Sprint Triathlon on 7 May 2023 in one hour and twenty-four minutes.",
             "D3:2"],
            ["Elias's sister Marta flew in from Porto for the weekend and met Pepper.", "D3:7"],
            ["Elias would like Noor to join him and Pepper for morning walks.", "D3:99"]],  # resolves to no turn
        A: [["Noor tried the pottery wheel for the first time on 6 May 2023 and made a leaning cylinder.",
             ["D3:10", "D3:11"]],
            ["Ingrid asked Noor to help at the studio's open day in June 2023.", "D3:13"],
            ["Noor and Sam booked the ferry on 11 May 2023.", "D3:15"],
            ["Noor is switching to day shifts from June 2023.", "D3:17"]]},
}
SUMMARIES = {
    1: "Noor told Elias about her first pottery class with Ingrid; Elias showed his new workbench and talked "
       "about his triathlon training. Noor works night shifts on the children's ward.",
    2: "Elias and his family adopted Pepper, a rescue greyhound mix. Noor is planning a trip to Norway with Sam "
       "in August. Elias signed up for the Lakeside Sprint Triathlon.",
    3: "Elias finished the triathlon and his sister Marta visited. Noor tried the pottery wheel, booked the "
       "ferry for Norway and will move to day shifts in June.",
}


def _turn(session: int, pos: int, turn: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"speaker": turn[0], "dia_id": f"D{session}:{pos}", "text": turn[1]}
    if len(turn) == 4:  # LoCoMo's image turns: url, BLIP caption, the search query that found the image
        out.update(img_url=[f"http://example.invalid/synth/{session}-{pos}.jpg"], blip_caption=turn[2], query=turn[3])
    return out


def _qa(question: str, answer: Any, evidence: list[str], category: int, adversarial: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"question": question}
    if answer is not None:
        item["answer"] = answer
    item.update(evidence=evidence, category=category)
    if adversarial is not None:
        item["adversarial_answer"] = adversarial
    return item


def build() -> list[dict[str, Any]]:
    """The dataset: a list with one LoCoMo-schema sample (``sample_id``, ``conversation``, ``qa``, ``observation``,
    ``session_summary``)."""
    conv: dict[str, Any] = {"speaker_a": A, "speaker_b": B}
    for n, (when, turns) in enumerate(SESSIONS, start=1):
        conv[f"session_{n}_date_time"] = when
        conv[f"session_{n}"] = [_turn(n, i, t) for i, t in enumerate(turns, start=1)]
    observation = {f"session_{n}_observation": facts for n, facts in OBSERVATIONS.items()}
    summary = {f"session_{n}_summary": text for n, text in SUMMARIES.items()}
    return [{"sample_id": SAMPLE_ID, "conversation": conv, "qa": [_qa(*q) for q in QA], "observation": observation,
             "session_summary": summary}]


def render() -> str:
    """``build()`` as the exact text of ``synthetic_mini.json`` (UTF-8, 2-space indent, final newline)."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> None:
    """Write ``render()`` to ``argv[0]`` (default ``OUT``)."""
    out = Path(argv[0]) if argv else OUT
    out.write_text(render(), encoding="utf-8")
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
