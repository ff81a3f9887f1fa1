"""StagePredict: bad replies are re-asked with the response cache bypassed; nothing is lost."""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.adapters import LenientChatAdapter
from nemori_dspy.errors import LLMError
from nemori_dspy.predict import StagePredict
from nemori_dspy.signatures import AnswerQuestion, NarrateEpisode, PartitionMessages
from tests.fakes import ScriptedLM, chat_reply, default_responders

GOOD = chat_reply(cue="Caroline at a support group (7 May 2023)", narrative="Caroline went to a support group.")


def _lm_with(replies: list[str], cache: bool = True) -> ScriptedLM:
    """Narration replies in order; the last one repeats."""
    it = iter(replies)
    state = {"last": replies[-1]}

    def narrate(_inputs):
        state["last"] = next(it, state["last"])
        return state["last"]

    r = default_responders()
    r["NarrateEpisode"] = narrate
    return ScriptedLM(r, cache=cache)


def _narrate(lm, parse_retries=1):
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        return StagePredict(NarrateEpisode, "narrate", parse_retries=parse_retries)(
            messages="[2023-05-08 13:56] Caroline: I went to a support group yesterday.")


@pytest.mark.parametrize("bad", [
    "",                                                                  # empty reply
    '[[ ## cue ## ]]\n{"cue": "Caroline at a supp',                     # truncated
    "[[ ## cue ## ]]\n{cue}\n\n[[ ## narrative ## ]]\n{narrative}",      # schema echoed back, no completion
    '{"cue": "x", "narrat',                                              # truncated JSON
])
def test_bad_reply_then_valid_succeeds_on_a_cache_bypassing_retry(bad, ledger):
    lm = _lm_with([bad, bad, GOOD], cache=True)  # ChatAdapter may fall back to JSONAdapter: 1-2 calls per attempt
    pred = _narrate(lm, parse_retries=3)
    assert pred.narrative == "Caroline went to a support group."
    assert ledger.counters.get("retries.narrate", 0) >= 1


def test_think_prefix_before_valid_reply_is_parsed_without_retry(ledger):
    lm = _lm_with(["<think>The user wants a narrative.</think>\n" + GOOD])
    pred = _narrate(lm)
    assert pred.cue.startswith("Caroline at a support group")
    assert ledger.counters.get("retries", 0) == 0


def test_retry_does_not_receive_the_cached_bad_reply():
    """At temperature 0 a cached bad reply would come back unchanged: the retry must reach the LM."""
    lm = _lm_with(["nonsense", "nonsense", GOOD], cache=True)
    _narrate(lm, parse_retries=3)
    first = lm.calls["NarrateEpisode"]
    # the same prompt again: the good reply is now served (from cache or LM), never the bad one
    assert _narrate(lm).narrative == "Caroline went to a support group."
    assert first >= 2


def test_permanent_failure_raises_llm_error_naming_the_stage(ledger):
    def boom(_):
        raise RuntimeError("connection refused")

    r = default_responders()
    r["NarrateEpisode"] = boom
    with pytest.raises(LLMError, match="narrate"):
        _narrate(ScriptedLM(r), parse_retries=2)
    assert ledger.counters["retries.narrate"] == 2


def test_cache_hits_are_counted_apart_from_real_calls(ledger):
    lm = _lm_with([GOOD], cache=True)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        p = StagePredict(PartitionMessages, "partition")
        for _ in range(3):
            p(messages="1. [2023-05-08 13:56] A: hi\n2. [2023-05-08 13:57] B: hello", message_count=2)
    u = ledger.snapshot()["partition"]
    assert u.calls == 1 and u.cache_hits == 2 and u.input_tokens > 0


def test_truncation_warning_names_the_stage_and_its_real_cap(caplog, ledger):
    """DSPy's warning names the LM's default max_tokens; ours names the stage's cap that was sent."""
    lm = _lm_with([GOOD], cache=False)
    lm.finish_reason = "length"
    with caplog.at_level("WARNING", logger="dspy.clients.lm"), dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        # cut at 320: a narrative is prose, so the reply that parsed is kept at once, marked, without a re-ask
        pred = StagePredict(NarrateEpisode, "narrate", max_tokens=320)(messages="[2023-05-08 13:56] Caroline: hi")
    assert pred.narrative and ledger.counters["truncated_accepted.narrate"] == 1 and len(lm.history) == 1
    notes = [r.getMessage() for r in caplog.records if "output cap" in r.getMessage()]
    assert all(r.name == "nemori_dspy.predict" for r in caplog.records if "output cap" in r.getMessage())
    assert notes and all("'narrate'" in m and "NEMORI_STAGE_LMS" in m for m in notes)
    assert "max_tokens=320" in notes[0] and "kept, without a re-ask" in notes[0]
    assert ledger.counters["truncated.narrate"] == len(notes)


def test_a_cut_answer_is_never_salvaged_but_a_cut_narrative_is():
    from nemori_dspy.predict import SALVAGE_TRUNCATED_STAGES

    assert "narrate" in SALVAGE_TRUNCATED_STAGES
    assert not {"answer", "judge", "partition", "select", "consolidate"} & SALVAGE_TRUNCATED_STAGES


def test_an_auth_error_suggests_setting_the_api_key_not_a_bigger_model():
    import litellm

    def denied(_):
        raise litellm.AuthenticationError("Missing credentials", llm_provider="openai", model="gpt-4o-mini")

    r = default_responders()
    r["NarrateEpisode"] = denied
    with pytest.raises(LLMError, match="API key"):
        _narrate(ScriptedLM(r), parse_retries=0)


# --- a reply cut off by its token cap is never used as it is

def _answer_lm(replies: list[tuple[str, str]], cache: bool = False) -> ScriptedLM:
    """Answer replies in order as (text, finish_reason); the last one repeats."""
    it = iter(replies)
    state = {"last": replies[-1]}
    lm: ScriptedLM

    def answer(_inputs):
        state["last"] = next(it, state["last"])
        text, lm.finish_reason = state["last"]
        return text

    r = default_responders()
    r["AnswerQuestion"] = answer
    lm = ScriptedLM(r, cache=cache)
    return lm


def _answer(lm, parse_retries=1, max_tokens=64):
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        return StagePredict(AnswerQuestion, "answer", max_tokens=max_tokens, parse_retries=parse_retries)(
            question="Who called?", context="Michael called on 7 May 2023.")


CUT = ('[[ ## answer ## ]]\nMi', "length")  # parses as the answer "Mi": only the finish reason tells
FULL = (chat_reply(answer="Michael"), "stop")


def test_a_truncated_reply_is_asked_again_with_twice_the_cap(ledger):
    lm = _answer_lm([CUT, FULL])
    assert _answer(lm, parse_retries=0).answer == "Michael"  # the extra attempt does not need a parse retry
    assert [h["kwargs"].get("max_tokens") for h in lm.history] == [64, 128]
    assert ledger.counters["truncation_retries.answer"] == 1


def test_an_answer_truncated_again_at_twice_the_cap_is_kept_as_it_parsed(ledger):
    """A looping 0.5B answer ran past 64 and 128 tokens on conv-26 and was scored empty; what it began with is kept."""
    lm = _answer_lm([CUT])
    assert _answer(lm, parse_retries=1).answer == "Mi"
    assert [h["kwargs"].get("max_tokens") for h in lm.history] == [64, 128]
    assert ledger.counters["truncated_accepted.answer"] == 1


def test_a_structured_reply_truncated_again_at_twice_the_cap_raises_instead_of_being_used():
    from nemori_dspy.signatures.response import JudgeAnswer

    r = default_responders()
    r["JudgeAnswer"] = lambda _i: chat_reply(reasoning="The answer names him.", label="CORRECT")
    lm = ScriptedLM(r)
    lm.finish_reason = "length"
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        with pytest.raises(LLMError, match=r"cut off at max_tokens=128"):
            StagePredict(JudgeAnswer, "judge", max_tokens=64, parse_retries=1)(
                question="q", gold_answer="g", generated_answer="a")


def test_a_cached_truncated_reply_is_not_used_either():
    lm = _answer_lm([CUT, FULL], cache=True)
    assert _answer(lm).answer == "Michael"
    assert _answer(lm).answer == "Michael"  # the cut reply at cap 64 comes from the cache: still refused
    assert lm.calls["AnswerQuestion"] == 2  # the second run was served from the cache


def test_a_programming_error_in_a_stage_is_raised_at_once_not_retried(ledger):
    calls = []

    class Broken(dspy.Module):
        def __init__(self, signature):
            super().__init__()

        def forward(self, **kwargs):
            calls.append(kwargs)
            raise TypeError("unsupported operand type(s)")

    with pytest.raises(TypeError, match="unsupported operand"):
        StagePredict(AnswerQuestion, "answer", parse_retries=3, predictor_class=Broken)(question="q", context="c")
    assert len(calls) == 1 and "retries" not in ledger.counters


def test_truncation_is_seen_even_when_dspy_logging_is_silenced(ledger):
    import logging

    logger = logging.getLogger("dspy.clients.lm")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        lm = _answer_lm([CUT, FULL])
        assert _answer(lm).answer == "Michael"
    finally:
        logger.setLevel(before)
    assert "truncated.answer" not in ledger.counters  # the log note did not run; the finish reason told


def test_a_re_ask_bypasses_the_cache_at_the_named_reroll_temperature():
    from nemori_dspy.predict import REROLL_TEMPERATURE

    configs = []

    class Flaky(dspy.Module):
        def __init__(self, signature):
            super().__init__()

        def forward(self, config=None, **kwargs):
            configs.append(dict(config or {}))
            if len(configs) == 1:
                raise ValueError("reply did not parse")
            return dspy.Prediction(answer="Michael")

    pred = StagePredict(AnswerQuestion, "answer", max_tokens=64, predictor_class=Flaky)(question="q", context="c")
    assert pred.answer == "Michael" and REROLL_TEMPERATURE > 0
    assert configs[0] == {"max_tokens": 64}  # the first ask: the LM's own temperature, cache allowed
    assert configs[1] == {"max_tokens": 64, "cache": False, "temperature": REROLL_TEMPERATURE, "rollout_id": 1}


# --- a cut list of insights keeps its complete items without a re-ask

def test_a_truncated_insight_list_keeps_its_complete_items_in_one_call(ledger):
    from nemori_dspy.signatures import DistillPredictionError

    r = default_responders()
    r["DistillPredictionError"] = lambda i: "[[ ## insights ## ]]\n[Caroline adopted Rex.]\n[Caroline walks Rex.]\n[Caro"
    lm = ScriptedLM(r)
    lm.finish_reason = "length"
    with dspy.context(lm=lm, adapter=LenientChatAdapter()):
        pred = StagePredict(DistillPredictionError, "distill", max_tokens=320)(
            episode_messages="[2023-05-08 13:00] Caroline: I adopted Rex.", predicted_episode="")
    assert pred.insights == ["Caroline adopted Rex.", "Caroline walks Rex."]  # "Caro", the item the cap cut, is gone
    assert lm.calls == {"DistillPredictionError": 1} and ledger.counters["truncated_accepted.distill"] == 1


def test_only_insight_lists_lose_their_last_item_when_cut():
    from nemori_dspy.predict import SALVAGE_TRUNCATED_STAGES, TRUNCATED_LIST_STAGES

    assert TRUNCATED_LIST_STAGES == {"distill", "direct_distill"} and TRUNCATED_LIST_STAGES <= SALVAGE_TRUNCATED_STAGES


def test_a_cut_reply_with_nothing_to_keep_is_asked_again_at_twice_the_cap(ledger):
    cut = "[[ ## cue ## ]]\n{cue}\n\n[[ ## narrative ## ]]\n{narrative}"  # cut and the schema echoed: nothing to keep
    lm = _lm_with([cut, GOOD], cache=False)
    lengths = iter(["length", "stop"])
    narrate = lm.responders["NarrateEpisode"]

    def reply(inputs):
        lm.finish_reason = next(lengths, "stop")
        return narrate(inputs)

    lm.responders["NarrateEpisode"] = reply
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = StagePredict(NarrateEpisode, "narrate", max_tokens=320)(messages="[2023-05-08 13:56] Caroline: hi")
    assert pred.narrative == "Caroline went to a support group."
    assert "truncated_accepted.narrate" not in ledger.counters and ledger.counters["truncation_retries.narrate"] == 1
    assert [h["kwargs"].get("max_tokens") for h in lm.history][-1] == 640


# --- a rate-limit refusal has no reply: re-asked unchanged, then RateLimitedError (not a plain failure)

def _refusing(times: int, retry_after: float | None = 2.0):
    """A predictor class whose first ``times`` calls are refused for rate limits as DSPy raises it."""
    from dspy import lm15
    from dspy.utils.exceptions import LMRateLimitError

    configs = []

    class Refusing(dspy.Module):
        def __init__(self, signature):
            super().__init__()

        def forward(self, config=None, **kwargs):
            configs.append(dict(config or {}))
            if len(configs) <= times:
                try:
                    raise lm15.RateLimitError("429 slow down", retry_after=retry_after)
                except lm15.RateLimitError as exc:
                    raise LMRateLimitError(str(exc), retry_after=retry_after) from exc
            return dspy.Prediction(answer="Michael")

    return Refusing, configs


def test_a_rate_limited_call_is_asked_again_unchanged(ledger):
    cls, configs = _refusing(1)
    pred = StagePredict(AnswerQuestion, "answer", max_tokens=64, predictor_class=cls)(question="q", context="c")
    assert pred.answer == "Michael"
    assert configs == [{"max_tokens": 64}, {"max_tokens": 64}]  # no reroll: there was no bad reply to escape


def test_a_call_still_rate_limited_raises_rate_limited_error_with_the_providers_wait(ledger):
    from nemori_dspy.errors import RateLimitedError

    cls, _ = _refusing(5, retry_after=7.0)
    with pytest.raises(RateLimitedError, match="rate limits") as caught:
        StagePredict(AnswerQuestion, "answer", predictor_class=cls, parse_retries=1)(question="q", context="c")
    assert isinstance(caught.value, LLMError) and caught.value.retry_after == 7.0
    assert ledger.counters["rate_limited_stage_calls"] == 1


def test_rate_limits_are_told_apart_from_an_exhausted_quota():
    from dspy import lm15

    from nemori_dspy.errors import is_rate_limit, suggested_wait

    def raised(inner, outer):
        try:
            try:
                raise inner
            except Exception as exc:
                raise outer from exc
        except Exception as exc:
            return exc

    wrapped = raised(lm15.RateLimitError("429", retry_after=3), ValueError("stage failed"))
    assert is_rate_limit(wrapped) and suggested_wait(wrapped) == 3.0  # found through the cause chain
    assert not is_rate_limit(raised(lm15.RateLimitError("429"), lm15.BillingError("insufficient_quota")))
    assert not is_rate_limit(ValueError("did not parse")) and suggested_wait(ValueError()) is None
