"""``StagePredict``: the one place a stage's predictor is called, with accounting and retries.

It sets the stage for the usage ledger, applies the stage's ``max_tokens``, and on a reply that
does not parse (or a provider error that survived litellm's own retries) re-asks with DSPy's
response cache bypassed and a nonzero temperature — at temperature 0 a cached bad reply would
come back unchanged. After ``parse_retries`` re-asks it raises ``LLMError``; callers park the work.
A rate-limit refusal that survived litellm's retries is re-asked unchanged (there was no bad reply to escape, so
no reroll); if the last attempt was refused too, ``RateLimitedError`` (an ``LLMError``) says so, so a caller that
can wait (the eval) asks again later instead of treating it as a failed reply.
A reply cut off by its token cap (finish_reason ``"length"``) of an answer or a structured stage is not used as it
is: it is asked again once with twice the cap (an extra attempt); cut again, a structured stage's counts as a failed
attempt, while the answer keeps what parsed (``KEEP_AFTER_REASK_STAGES``: a looping answer still begins with it). A
prose or list stage (``SALVAGE_TRUNCATED_STAGES``) keeps a cut reply that parses at once (a list without its last
item). Other errors (``TypeError`` ...) are programming errors and propagate unretried.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
import re
from typing import Any, Callable

import dspy

from .errors import ConfigError, LLMError, RateLimitedError, is_rate_limit, suggested_wait
from .recording import current_recorder
from .stages import KEEP_AFTER_REASK_STAGES, SALVAGE_TRUNCATED_STAGES, TRUNCATED_LIST_STAGES
from .usage import current_stage, note_truncation, stage, tally, watch_truncation

__all__ = ["StagePredict", "load_predictor_class", "TruncatedReplyError", "SchemaEchoError", "REROLL_TEMPERATURE",
           "SALVAGE_TRUNCATED_STAGES", "TRUNCATED_LIST_STAGES"]

log = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"^\s*\{\w+\}\s*$")
_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("nemori_stage_cap", default=None)


class _TruncationNote(logging.Filter):
    """Rewrite DSPy's truncation warning, which names the LM's default ``max_tokens`` rather than the
    per-call cap a stage actually sent, so the log states the stage, its real cap and how to raise it;
    each truncation is also counted in the ledger as ``truncated.<stage>``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("LM response was truncated"):
            name, cap = current_stage(), _CAP.get()
            tally(f"truncated.{name}")
            note_truncation("log")
            fate = ("what parsed is kept, without a re-ask" if name in SALVAGE_TRUNCATED_STAGES else
                    "asked again once with twice the cap; cut again, what parsed is kept"
                    if name in KEEP_AFTER_REASK_STAGES else
                    "it is not used: asked again once with twice the cap, else retried or parked")
            record.msg = (f"stage {name!r}: the reply hit its output cap (max_tokens={cap}); {fate}. To raise the "
                          f"cap: NEMORI_STAGE_LMS='{{\"{name}\": {{\"max_tokens\": N}}}}'")
            record.args = ()
            record.name = __name__  # our message: logged under this module, not DSPy's
        return True


logging.getLogger("dspy.clients.lm").addFilter(_TruncationNote())


class SchemaEchoError(ValueError):
    """The reply repeated the output template (e.g. ``{narrative}``) instead of filling it in."""


class TruncatedReplyError(ValueError):
    """The reply of stage ``stage`` was cut off by its output token cap (finish_reason ``"length"``)."""

    def __init__(self, stage: str, cap: int | None, pred: dspy.Prediction | None = None) -> None:
        self.stage, self.cap, self.pred = stage, cap, pred  # pred: what did parse of the cut reply, if anything
        super().__init__(f"stage {stage!r}: the reply was cut off at max_tokens={cap}")


#: sampling temperature of a re-ask (which also bypasses DSPy's response cache). Nonzero because at
#: temperature 0 a deterministic server answers the same prompt with the same bad reply; 0.7 is the usual
#: default sampling temperature of chat models, varied enough to escape a format slip while staying on task.
REROLL_TEMPERATURE = 0.7


@functools.cache
def _retryable() -> tuple[type[BaseException], ...]:
    """Errors a re-ask can cure: unparseable or invalid replies (DSPy ``AdapterParseError``, pydantic
    ``ValidationError`` and other ``ValueError`` such as ``SchemaEchoError``), and provider, transport and
    timeout errors (DSPy's ``LMError`` wrapping them, litellm/OpenAI and httpx errors). Programming errors
    (``TypeError``, ``AttributeError``, ``KeyError`` ...) are not among them: they propagate at once."""
    from dspy.utils.exceptions import AdapterParseError, LMError

    kinds: list[type[BaseException]] = [AdapterParseError, LMError, ValueError, TimeoutError, ConnectionError]
    for module, name in (("openai", "OpenAIError"), ("httpx", "HTTPError")):
        try:
            kinds.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(kinds)


def check_not_echo(pred: dspy.Prediction) -> dspy.Prediction:
    """Raise ``SchemaEchoError`` if any string output is a bare ``{field}`` placeholder."""
    for key, value in pred.items():
        if isinstance(value, str) and _PLACEHOLDER.match(value):
            raise SchemaEchoError(f"output field {key!r} is the placeholder {value.strip()!r}")
    return pred


def load_predictor_class(path: str) -> Callable[[type[dspy.Signature]], dspy.Module]:
    """Import a predictor class from a dotted path such as ``dspy.ChainOfThought``.

    Raises:
        ConfigError: the path does not name an importable attribute.
    """
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"predictor class {path!r} cannot be imported ({exc}). Fix: give a dotted path "
                          "such as 'dspy.Predict' or 'dspy.ChainOfThought'.") from exc


def _fix_for(exc: Exception | None) -> str:
    """The fix to suggest for a stage's last error: credentials, an unreachable server, or the format."""
    chain, seen = [], exc  # DSPy may wrap the provider's error: look through causes and the message
    while seen is not None and len(chain) < 5:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(f"{type(e).__name__} {e}" for e in chain)
    if isinstance(exc, TruncatedReplyError):
        return (f"raise the stage's output cap above {exc.cap}, e.g. NEMORI_STAGE_LMS='{{\"{exc.stage}\": "
                f"{{\"max_tokens\": {2 * (exc.cap or 512)}}}}}', or use a model that answers more briefly (a small model "
                "that repeats itself, e.g. the same list over and over, hits any cap: a larger model is the fix then).")
    if is_rate_limit(exc):
        return ("the provider refused for rate limits after litellm's retries (num_retries, NEMORI_NUM_RETRIES): "
                "wait, lower --concurrency, or raise num_retries.")
    if any(k in text for k in ("AuthenticationError", "PermissionDeniedError", "Missing credentials", "api_key")):
        return ("set the provider's API key (e.g. OPENAI_API_KEY) or NEMORI_API_KEY, or use --model local for the "
                "embedded model.")
    if any(k in text for k in ("APIConnectionError", "Connection refused", "ServiceUnavailableError")):
        return "check that the model server is up and reachable at the configured api_base."
    return ("check the model server is up and the model can follow the format (try a larger model or "
            "adapter='json').")


def _without_last_items(pred: dspy.Prediction) -> dspy.Prediction:
    """``pred`` with the last item of each list field removed (the item a token cap may have cut)."""
    return dspy.Prediction(**{k: (v[:-1] if isinstance(v, list) else v) for k, v in pred.items()})


class StagePredict(dspy.Module):
    """Run one signature as pipeline stage ``stage_name``.

    Args:
        signature: the stage's ``dspy.Signature``.
        stage_name: ledger name, one of ``nemori_dspy.stages.STAGES``.
        max_tokens: output cap for this stage (None = the LM's default).
        parse_retries: re-asks after a failed call, each bypassing the response cache.
        lm: a stage-specific LM (None = the one in ``dspy.settings``).
        predictor_class: DSPy predictor wrapping the signature (default ``dspy.Predict``).
    Raises (from ``forward``):
        LLMError: every attempt failed; the message names the stage and the last error.
        RateLimitedError: the same, when the last attempt was refused for rate limits (an ``LLMError``).
    """

    def __init__(self, signature: type[dspy.Signature], stage_name: str, max_tokens: int | None = None,
                 parse_retries: int = 1, lm: dspy.BaseLM | None = None,
                 predictor_class: Callable[..., dspy.Module] = dspy.Predict) -> None:
        super().__init__()
        self.stage_name = stage_name
        self.max_tokens = max_tokens
        self.parse_retries = parse_retries
        self.predict = predictor_class(signature)
        if lm is not None:
            self.predict.set_lm(lm)

    def _config(self, reroll: int, cap: int | None) -> dict[str, Any]:
        config: dict[str, Any] = {}
        if cap:
            config["max_tokens"] = cap
        if reroll:
            config.update(cache=False, temperature=REROLL_TEMPERATURE, rollout_id=reroll)
        return config

    def forward(self, **inputs: Any) -> dspy.Prediction:
        token = _CAP.set(self.max_tokens)
        try:
            return self._attempts(inputs)
        finally:
            _CAP.reset(token)

    def _wider(self, cap: int | None) -> int | None:
        """Twice ``cap`` (or twice the LM's own ``max_tokens`` when the stage sets none); None if unknown."""
        if cap:
            return cap * 2
        lm = getattr(self.predict, "lm", None) or dspy.settings.lm
        base = (getattr(lm, "kwargs", None) or {}).get("max_tokens")
        return int(base) * 2 if base else None

    def _once(self, inputs: dict[str, Any], reroll: int, cap: int | None) -> dspy.Prediction:
        """One predictor call; raises ``TruncatedReplyError`` if a reply was cut by its token cap."""
        token = _CAP.set(cap)
        try:
            with watch_truncation() as cut:
                pred = self.predict(**inputs, config=self._config(reroll, cap))
        finally:
            _CAP.reset(token)
        if cut:
            try:
                parsed: dspy.Prediction | None = check_not_echo(pred)
            except SchemaEchoError:
                parsed = None
            raise TruncatedReplyError(self.stage_name, cap, parsed)
        return self._record(inputs, check_not_echo(pred))

    def _record(self, inputs: dict[str, Any], pred: dspy.Prediction) -> dspy.Prediction:
        """Tuning data: what this stage saw and returned, when a recorder is active (``recording.py``)."""
        recorder = current_recorder()
        if recorder is not None:
            recorder.record(self.stage_name, inputs, dict(pred.items()))
        return pred

    def _keep_cut(self, pred: dspy.Prediction, cap: int | None) -> dspy.Prediction:
        """A cut reply of a ``SALVAGE_TRUNCATED_STAGES`` stage (or of a ``KEEP_AFTER_REASK_STAGES`` stage cut again at
        twice the cap), kept (``truncated_accepted.<stage>``, logged); a list stage's lists lose their last item, the
        one the cap may have cut (``TRUNCATED_LIST_STAGES``)."""
        tally(f"truncated_accepted.{self.stage_name}")
        log.info("stage %s: the reply hit its cap (max_tokens=%s); keeping what parsed (truncated_accepted.%s)",
                 self.stage_name, cap, self.stage_name)
        return _without_last_items(pred) if self.stage_name in TRUNCATED_LIST_STAGES else pred

    def _attempts(self, inputs: dict[str, Any]) -> dspy.Prediction:
        """Up to ``parse_retries + 1`` calls; a truncated reply gets one more call at twice the cap."""
        last: Exception | None = None
        cap, widened, reroll, n, budget = self.max_tokens, False, 0, 0, self.parse_retries + 1
        with stage(self.stage_name):
            while n < budget:
                if n:
                    tally("retries")
                    tally(f"retries.{self.stage_name}")
                try:
                    return self._once(inputs, reroll, cap)
                except TruncatedReplyError as exc:
                    if exc.pred is not None and (self.stage_name in SALVAGE_TRUNCATED_STAGES
                                                 or widened and self.stage_name in KEEP_AFTER_REASK_STAGES):
                        return self._record(inputs, self._keep_cut(exc.pred, cap))
                    last, wider = exc, (None if widened else self._wider(cap))
                    if wider is not None:  # the same request with room to finish; its cache key differs
                        widened, cap, budget = True, wider, max(budget, n + 2)
                        tally(f"truncation_retries.{self.stage_name}")
                    else:
                        reroll += 1
                except _retryable() as exc:  # parse, validation, provider, transport, timeout: re-ask
                    # a rate limit had no reply: the same request again (a reroll escapes only a bad reply)
                    last, reroll = exc, reroll if is_rate_limit(exc) else reroll + 1
                log.warning("stage %s: reply %d not used, asking again: %s", self.stage_name, n + 1, str(last)[:300])
                n += 1
        tally("failed_stage_calls")
        message = (f"stage {self.stage_name!r} failed after {n} attempt(s): "
                   f"{type(last).__name__}: {str(last)[:500]}. Fix: {_fix_for(last)}")
        if is_rate_limit(last):
            tally("rate_limited_stage_calls")
            raise RateLimitedError(message, suggested_wait(last)) from last
        raise LLMError(message) from last
