"""One error tree for nemori-dspy. Every message says what was wrong and how to fix it."""

from __future__ import annotations

__all__ = [
    "NemoriError",
    "InvalidInputError",
    "UnknownUserError",
    "NotFoundError",
    "ConfigError",
    "MissingExtraError",
    "EmbedderMismatchError",
    "StoreError",
    "LLMError",
    "RateLimitedError",
    "is_rate_limit",
    "suggested_wait",
    "ModelServerError",
    "DatasetError",
]


class NemoriError(Exception):
    """Base class of every error raised by nemori-dspy."""


class InvalidInputError(NemoriError, ValueError):
    """A caller-supplied value is invalid; the message names the field and the fix.

    Args:
        field: dotted path of the offending field, e.g. ``messages[3].timestamp``.
        problem: what is wrong with it.
        fix: what the caller should do instead.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class UnknownUserError(NemoriError, KeyError):
    """The user id has no messages, episodes or semantic entries in this store."""

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        super().__init__(
            f"unknown user {user_id!r}: nothing was ever added for this user. "
            "Fix: call Memory.add_messages(user_id, ...) first, or check the id's spelling."
        )

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return self.args[0]


class NotFoundError(NemoriError, KeyError):
    """An episode or semantic entry id does not exist for this user."""

    def __str__(self) -> str:
        return self.args[0]


class ConfigError(NemoriError):
    """The configuration cannot work as given (missing model file, bad model string...)."""


class MissingExtraError(ConfigError, ImportError):
    """A feature needs a package of an optional extra that is not installed (the core install serves memory
    without the eval, optimize and local-model dependencies); the message names the pip command, for an installed
    package and for a source checkout (``pip install -e ".[eval]"`` from the repository root).

    Also an ``ImportError``, so code that treats a missing optional dependency as an import failure still does.

    Args:
        extra: the nemori-dspy extra that provides it (``eval``, ``optimize``, ``local``, ``serve``...).
        module: the missing top-level module (``nltk``).
        purpose: what needs it, e.g. ``"nemori-dspy eval"`` (default: "this feature").
        alternative: another fix, appended as ``..., or <alternative>``.
    """

    def __init__(self, extra: str, module: str, purpose: str | None = None, alternative: str | None = None) -> None:
        self.extra, self.module = extra, module
        self.command = f'pip install "nemori-dspy[{extra}]"'
        self.checkout_command = f'pip install -e ".[{extra}]"'
        super().__init__(f"{purpose or 'this feature'} needs {module!r}, which is not installed (it comes with the "
                         f"{extra!r} extra; the core install has only what serving memory needs). "
                         f"Fix: {self.command} (from a source checkout: {self.checkout_command})"
                         + (f", or {alternative}" if alternative else ""))
        self.name = module


class EmbedderMismatchError(ConfigError):
    """A store built with one embedder was reopened with another of a different name or dimension."""


class StoreError(NemoriError):
    """The memory store failed in a way the caller may retry (locked, I/O, schema)."""


class LLMError(NemoriError):
    """An LLM call failed permanently after retries; the work is parked, never dropped."""


class RateLimitedError(LLMError):
    """The provider refused an LLM call for rate limits (HTTP 429) after litellm's own retries (``num_retries``,
    exponential backoff). Not a bad reply: there was none, so a caller that can wait should ask again later
    (the eval leaves the question unanswered rather than scoring it, see ``eval.runner``).

    Args:
        message: what failed and the fix.
        retry_after: seconds the provider asked to wait (its ``Retry-After``), None when it gave none.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


_RATE_LIMIT_NAMES = frozenset({"RateLimitError", "LMRateLimitError", "RouterRateLimitError", "RateLimitedError"})
_QUOTA_NAMES = frozenset({"BillingError", "LMBillingError", "BudgetExceededError"})


def _chain(exc: BaseException | None, depth: int = 8) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and len(out) < depth and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def is_rate_limit(exc: BaseException | None) -> bool:
    """True if ``exc`` (or an error it was raised from) is a provider's rate-limit refusal: litellm's, OpenAI's,
    DSPy's ``LMRateLimitError`` or ours. Judged by class name, so no provider SDK is imported. An exhausted quota
    or budget (also an HTTP 429 at OpenAI; DSPy's ``LMBillingError``) is not a rate limit: waiting does not cure it."""
    names = {c.__name__ for e in _chain(exc) for c in type(e).__mro__}
    return bool(names & _RATE_LIMIT_NAMES) and not names & _QUOTA_NAMES


def suggested_wait(exc: BaseException | None) -> float | None:
    """The seconds a rate-limit refusal asked to wait (``retry_after`` of ``exc`` or of an error it was raised
    from), None when none says."""
    for e in _chain(exc):
        wait = getattr(e, "retry_after", None)
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait >= 0:
            return float(wait)
    return None


class ModelServerError(NemoriError):
    """The local llama.cpp server could not be started or did not become ready."""


class DatasetError(NemoriError):
    """A benchmark dataset file is missing or does not follow its schema."""
