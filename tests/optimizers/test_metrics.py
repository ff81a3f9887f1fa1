"""Stage metrics and their GEPA feedback on hand-computed examples."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.optimizers.metrics import (answer_coverage, answer_metric, consolidate_metric, distill_metric,
                                            extract_dates, length_penalty, narrate_metric, restatements,
                                            unresolved_relative_dates)

MSGS = "\n".join([
    "[2023-03-02 09:00] Ada: Hi Ben! I adopted a cat named Miso (yesterday, 1 March 2023).",
    "[2023-03-02 09:01] Ben: Congrats! I started violin lessons with my teacher Mr. Okafor in town.",
    "[2023-03-02 09:02] Ada: Miso is grey and very shy, she hides under the bed all day long.",
    "[2023-03-02 09:03] Ben: So cute, I hope she settles in soon and we can meet her.",
])  # 51 content words (12 + 12 + 14 + 13); with the "[date] speaker" prefixes 75 words


def test_dates_are_compared_as_dates():
    assert extract_dates("on May 7, 2023 and 2023-06-01")[0] == [(2023, 5, 7), (2023, 6, 1)]
    assert answer_coverage("Ada adopted Miso on 1 March 2023.", "1 March 2023") == 1.0
    assert answer_coverage("It happened on March 1st, 2023.", "1 March 2023") == 1.0
    assert answer_coverage("It happened in March 2023.", "1 March 2023") == 0.0   # the gold names a day
    assert answer_coverage("On 12 March 2023 she left.", "March 2023") == 1.0      # any day of that month
    # words and dates each weigh half: 'week before' found, the date not
    assert answer_coverage("the week before her birthday", "The week before 9 June 2023") == 0.5
    assert answer_coverage("anything", "") is None


def test_length_penalty_makes_copying_lose():
    assert length_penalty("Ada adopted a cat named Miso.", MSGS)[0] == 0.0
    pen, ratio = length_penalty(MSGS, MSGS)
    assert ratio == pytest.approx(75 / 51) and pen == pytest.approx(ratio - 0.5)


def test_narrate_metric_hand_computed():
    ex = dspy.Example(messages=MSGS, gold_answers=["Miso", "1 March 2023", "Mr. Okafor"],
                      questions=["cat name?", "when adopted?", "violin teacher?"]).with_inputs("messages")
    good = dspy.Prediction(cue="Ada adopts Miso (1 March 2023)",
                           narrative="On 1 March 2023 Ada adopted a shy grey cat, Miso; Ben began violin lessons.")
    # Miso 1, date 1, 'Mr. Okafor' → tokens {mr, okafor}: 0 → coverage 2/3; 16 words / 51 < 0.5: no penalty
    assert narrate_metric(ex, good) == pytest.approx(2 / 3)
    fb = narrate_metric(ex, good, None, "narrate.predict", None)
    assert fb.score == pytest.approx(2 / 3) and "'Mr. Okafor' (asked: violin teacher?)" in fb.feedback
    copy = dspy.Prediction(cue="Chat", narrative=MSGS)
    assert narrate_metric(ex, copy) < narrate_metric(ex, good)        # verbatim copying does not win
    relative = dspy.Prediction(cue="Ada adopts Miso", narrative="Yesterday Ada adopted Miso; Ben has a teacher.")
    fb = narrate_metric(ex, relative, None, "narrate.predict", None)
    # Miso 1, date 0, Okafor 0 → 1/3, minus 0.1 for 'Yesterday' left relative
    assert fb.score == pytest.approx(1 / 3 - 0.1) and "'Yesterday'" in fb.feedback
    assert unresolved_relative_dates("yesterday (1 March 2023)") == []


def test_distill_metric_penalises_restating_memory():
    ex = dspy.Example(episode_messages=MSGS, gold_answers=["Miso"], known_before=["Ada has a cat named Miso."])
    again = dspy.Prediction(insights=["Ada has a cat named Miso.", "Ben takes violin lessons."])
    assert restatements(again.insights, ex.known_before) == ["Ada has a cat named Miso."]
    assert distill_metric(ex, again) == pytest.approx(1.0 - 0.1)
    fb = distill_metric(ex, again, None, "distill.predict", None)
    assert "restate what memory already knew" in fb.feedback
    none = dspy.Prediction(insights=[])
    assert distill_metric(ex, none) == 0.0
    assert "not extracted: 'Miso'" in distill_metric(ex, none, None, "distill.predict", None).feedback


@pytest.mark.parametrize("action,targets,score", [("conflict", [1], 1.0), ("conflict", [1, 2], 0.75),
                                                  ("new", [], 0.0), ("merge", [1], 0.0)])
def test_consolidate_metric(action, targets, score):
    ex = dspy.Example(action="conflict", targets=[1])
    assert consolidate_metric(ex, dspy.Prediction(action=action, targets=targets)) == score


def test_answer_metric_is_token_f1_with_feedback():
    ex = dspy.Example(answer="Lisbon, Portugal")
    assert answer_metric(ex, dspy.Prediction(answer="Lisbon")) == pytest.approx(2 / 3)
    fb = answer_metric(ex, dspy.Prediction(answer="Porto"), None, "answer.predict", None)
    assert fb.score == 0.0 and "'Lisbon, Portugal'" in fb.feedback


def test_judge_f1_metric_weighs_the_verdict_and_f1_and_asks_the_judge_once_per_answer():
    import dspy

    from nemori_dspy.optimizers.metrics import JudgeF1Metric

    asked = []

    def judge(example, pred):
        asked.append(pred.answer)
        return 1.0 if "teammates" in pred.answer else 0.0

    metric = JudgeF1Metric(judge, 0.5)
    ex = dspy.Example(question="Who does he play with?", answer="teammates on his video game team")
    terse, full = dspy.Prediction(answer="Yes"), dspy.Prediction(answer="his teammates on the video game team")
    assert metric(ex, terse) == 0.0  # F1 0, judge WRONG
    assert metric(ex, full) == pytest.approx(0.5 + 0.5 * metric.parts(ex, full)["f1"])
    assert metric.parts(ex, full)["judge"] == 1.0 and asked == ["Yes", "his teammates on the video game team"]
    fb = metric(ex, terse, pred_name="answer.predict")
    assert fb.score == 0.0 and "Wrong (LLM judge)" in fb.feedback and "teammates on his video game team" in fb.feedback
    with pytest.raises(ValueError, match="judge_weight"):
        JudgeF1Metric(judge, 1.5)


class _RecallMatcher:
    """FactMatcher's interface with content-word recall alone (no embedder): ``[i, j]`` = candidate j holds
    ≥ 60% of text i's content words."""

    def match_matrix(self, golds, candidates):
        import numpy as np

        from nemori_dspy.eval.memory_quality import content_recall

        return np.array([[content_recall(g, c) >= 0.6 for c in candidates] for g in golds], dtype=bool).reshape(
            len(golds), len(candidates))


def _recall_support():
    from nemori_dspy.eval.memory_quality import SupportChecker

    return SupportChecker.with_matcher(_RecallMatcher())


_MSGS = ("[2023-04-03 09:00] Noor: I went to my first pottery class on Saturday.\n"
         "[2023-04-03 09:01] Elias: Nice! I finished my oak workbench.\n"
         "[2023-04-03 09:02] Noor: My teacher Ingrid is a retired chemist.")
_OBS = ["Noor went to her first pottery class on Saturday.", "Elias finished building an oak workbench.",
        "Noor's pottery teacher Ingrid is a retired chemist."]


def _narr(text, cue="Noor and Elias talk"):
    import dspy

    return dspy.Prediction(cue=cue, narrative=text)


def test_observation_metric_scores_narratives_by_gold_coverage_and_faithfulness():
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric

    metric = ObservationMetric(_RecallMatcher(), "narrate", _recall_support())
    ex = dspy.Example(messages=_MSGS, observations=_OBS)
    full = _narr("Noor went to her first pottery class on Saturday. Elias finished his oak workbench. "
                 "Noor's teacher Ingrid is a retired chemist.")
    half = _narr("Noor went to her first pottery class on Saturday. Noor adopted a parrot named Kiwi.")
    assert metric(ex, full) > metric(ex, half) > 0
    fb = metric(ex, half, pred_name="narrate.predict").feedback
    assert "Covers 1 of 3" in fb and "Missed:" in fb and "parrot" in fb  # the invented sentence is named
    # an echoed field description and a copied chat line score 0, whatever else they hold
    from nemori_dspy.signatures import NarrateEpisode

    echo = NarrateEpisode.output_fields["narrative"].json_schema_extra["desc"]  # the description, echoed back
    assert metric(ex, _narr(echo)) == 0.0
    assert metric(ex, _narr("Noor: I went to my first pottery class on Saturday.")) == 0.0
    # without observations the answer-coverage metric decides
    assert metric(dspy.Example(messages=_MSGS, gold_answers=["Ingrid"]), full) == pytest.approx(
        __import__("nemori_dspy.optimizers.metrics", fromlist=["x"]).narrate_metric(
            dspy.Example(messages=_MSGS, gold_answers=["Ingrid"]), full))


def test_observation_metric_reads_a_pronoun_led_sentence_as_the_person_before_it():
    """Faithfulness resolves "She" as the Memory table does (``resolve_pronouns``): after a sentence about Noor,
    "She said her teacher …" is Noor's (stated); after one about Elias it is his, and he said no such thing."""
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric

    metric = ObservationMetric(_RecallMatcher(), "narrate", _recall_support())
    ex = dspy.Example(messages=_MSGS, observations=_OBS)
    said = "She said her teacher Ingrid is a retired chemist."
    noor = metric(ex, _narr(f"Noor went to her first pottery class on Saturday. {said}"), pred_name="narrate.predict")
    elias = metric(ex, _narr(f"Elias finished his oak workbench. {said}"), pred_name="narrate.predict")
    assert "2 of 2 sentences are stated" in noor.feedback
    assert "1 of 2 sentences are stated" in elias.feedback


def test_observation_metric_rewards_distilling_only_what_memory_missed():
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric

    metric = ObservationMetric(_RecallMatcher(), "distill", _recall_support())
    ex = dspy.Example(episode_messages=_MSGS, observations=_OBS, known_before=[_OBS[0]])
    new_only = dspy.Prediction(insights=[_OBS[1], _OBS[2]])
    with_known = dspy.Prediction(insights=[_OBS[0], _OBS[1], _OBS[2]])
    invented = dspy.Prediction(insights=[_OBS[1], "Elias owns three horses in Norway."])
    assert metric(ex, new_only) > metric(ex, with_known)  # restating memory costs
    assert metric(ex, new_only) > metric(ex, invented)  # unsupported and missed cost
    fb = metric(ex, invented, pred_name="distill.predict").feedback
    assert "2 of 3 gold observations were new" in fb and "horses" in fb and "Ingrid" in fb
    held = dspy.Example(episode_messages=_MSGS, observations=_OBS[:1], known_before=[_OBS[0]])
    assert metric(held, dspy.Prediction(insights=[])) == 1.0  # nothing new: saying nothing is right


def test_observation_metric_parts_split_the_score_for_reports():
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric

    distill = ObservationMetric(_RecallMatcher(), "distill", _recall_support())
    ex = dspy.Example(episode_messages=_MSGS, observations=_OBS, known_before=[_OBS[0]])
    invented = dspy.Prediction(insights=[_OBS[1], "Elias owns three horses in Norway."])
    assert distill.parts(ex, invented) == {"recall": 0.5, "support": 0.5}  # 1 of 2 new found; 1 of 2 stated
    assert distill.parts(ex, dspy.Prediction(insights=[_OBS[1], _OBS[2]])) == {"recall": 1.0, "support": 1.0}
    assert distill.parts(dspy.Example(episode_messages=_MSGS, gold_answers=["Ingrid"]), invented) == {}
    narrate = ObservationMetric(_RecallMatcher(), "narrate", _recall_support())
    nex = dspy.Example(messages=_MSGS, observations=_OBS)
    half = narrate.parts(nex, _narr("Noor went to her first pottery class on Saturday. Noor adopted a parrot named Kiwi."))
    assert half["coverage"] == pytest.approx(1 / 3) and half["faithfulness"] == 0.5
    assert narrate.parts(nex, _narr("Noor: I went to my first pottery class on Saturday.")) == {
        "coverage": 0.0, "faithfulness": 0.0}  # a copied chat line is unusable: both parts 0, as its score


def test_score_program_pairs_observation_parts_before_and_after():
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric
    from nemori_dspy.optimizers.optimize import score_program

    class Fixed(dspy.Module):
        def __init__(self, insights):
            super().__init__()
            self.insights = insights

        def forward(self, **_):
            return dspy.Prediction(insights=self.insights)

    metric = ObservationMetric(_RecallMatcher(), "distill", _recall_support())
    dev = [dspy.Example(episode_messages=_MSGS, observations=_OBS, known_before=[]).with_inputs("episode_messages")]
    score = score_program(Fixed([_OBS[1]]), dev, metric)
    assert score.parts == {"recall": [pytest.approx(1 / 3)], "support": [1.0]}


def test_observation_metric_parts_after_scoring_embed_nothing_again():
    import dspy

    from nemori_dspy.optimizers.metrics import ObservationMetric

    class Counting(_RecallMatcher):
        calls = 0

        def match_matrix(self, *args, **kwargs):
            Counting.calls += 1
            return super().match_matrix(*args, **kwargs)

    metric = ObservationMetric(Counting(), "distill", _recall_support())
    ex = dspy.Example(episode_messages=_MSGS, observations=_OBS, known_before=[_OBS[0]])
    pred = dspy.Prediction(insights=[_OBS[1]])
    score = metric(ex, pred)
    calls = Counting.calls
    assert metric.parts(ex, pred) == {"recall": 0.5, "support": 1.0} and Counting.calls == calls
    assert metric(ex, dspy.Prediction(insights=[_OBS[1], _OBS[2]])) > score  # another output is measured anew
