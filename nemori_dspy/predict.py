"""``StagePredict``: the one place a stage's predictor is called, with accounting and retries.

It sets the stage for the usage ledger, applies the stage's ``max_tokens``, and on a reply that
does not parse (or a provider error that survived litellm's own retries) re-asks with DSPy's
response cache bypassed and a nonzero temperature — at temperature 0 a cached bad reply would
come back unchanged. After ``parse_retries`` re-asks it raises ``LLMError``; callers park the work.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import re
from typing import Any, Callable

import dspy

from .errors import ConfigError, LLMError
from .recording import current_recorder
from .usage import LEDGER, current_stage, stage

__all__ = ["StagePredict", "load_predictor_class"]

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
            LEDGER.count(f"truncated.{name}")
            record.msg = (f"stage {name!r}: the reply hit its output cap (max_tokens={cap}); it is parsed if it can "
                          f"be, else retried or parked. To raise the cap: NEMORI_STAGE_LMS='{{\"{name}\": "
                          f"{{\"max_tokens\": N}}}}'")
            record.args = ()
            record.name = __name__  # our message: logged under this module, not DSPy's
        return True


logging.getLogger("dspy.clients.lm").addFilter(_TruncationNote())


class SchemaEchoError(ValueError):
    """The reply repeated the output template (e.g. ``{narrative}``) instead of filling it in."""


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
    if any(k in text for k in ("AuthenticationError", "PermissionDeniedError", "Missing credentials", "api_key")):
        return ("set the provider's API key (e.g. OPENAI_API_KEY) or NEMORI_API_KEY, or use --model local for the "
                "embedded model.")
    if any(k in text for k in ("APIConnectionError", "Connection refused", "ServiceUnavailableError")):
        return "check that the model server is up and reachable at the configured api_base."
    return ("check the model server is up and the model can follow the format (try a larger model or "
            "adapter='json').")


class StagePredict(dspy.Module):
    """Run one signature as pipeline stage ``stage_name``.

    Args:
        signature: the stage's ``dspy.Signature``.
        stage_name: ledger name, one of ``nemori_dspy.config.STAGES``.
        max_tokens: output cap for this stage (None = the LM's default).
        parse_retries: re-asks after a failed call, each bypassing the response cache.
        lm: a stage-specific LM (None = the one in ``dspy.settings``).
        predictor_class: DSPy predictor wrapping the signature (default ``dspy.Predict``).
    Raises (from ``forward``):
        LLMError: every attempt failed; the message names the stage and the last error.
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

    def _config(self, attempt: int) -> dict[str, Any]:
        config: dict[str, Any] = {}
        if self.max_tokens:
            config["max_tokens"] = self.max_tokens
        if attempt:
            config.update(cache=False, temperature=0.7, rollout_id=attempt)
        return config

    def forward(self, **inputs: Any) -> dspy.Prediction:
        token = _CAP.set(self.max_tokens)
        try:
            return self._attempts(inputs)
        finally:
            _CAP.reset(token)

    def _attempts(self, inputs: dict[str, Any]) -> dspy.Prediction:
        last: Exception | None = None
        with stage(self.stage_name):
            for attempt in range(self.parse_retries + 1):
                if attempt:
                    LEDGER.count("retries")
                    LEDGER.count(f"retries.{self.stage_name}")
                try:
                    pred = check_not_echo(self.predict(**inputs, config=self._config(attempt)))
                except Exception as exc:  # parse errors and provider errors alike: re-ask, then park
                    last = exc
                    log.warning("stage %s attempt %d failed: %s", self.stage_name, attempt + 1, str(exc)[:300])
                    continue
                recorder = current_recorder()
                if recorder is not None:  # tuning data: what this stage saw and returned (recording.py)
                    recorder.record(self.stage_name, inputs, dict(pred.items()))
                return pred
        LEDGER.count("failed_stage_calls")
        raise LLMError(f"stage {self.stage_name!r} failed after {self.parse_retries + 1} attempt(s): "
                       f"{type(last).__name__}: {str(last)[:500]}. Fix: {_fix_for(last)}") from last
