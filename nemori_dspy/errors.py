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
    without the eval, optimize and local-model dependencies); the message names the pip command.

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
        super().__init__(f"{purpose or 'this feature'} needs {module!r}, which is not installed (it comes with the "
                         f"{extra!r} extra; the core install has only what serving memory needs). "
                         f"Fix: {self.command}" + (f", or {alternative}" if alternative else ""))
        self.name = module


class EmbedderMismatchError(ConfigError):
    """A store built with one embedder was reopened with another of a different name or dimension."""


class StoreError(NemoriError):
    """The memory store failed in a way the caller may retry (locked, I/O, schema)."""


class LLMError(NemoriError):
    """An LLM call failed permanently after retries; the work is parked, never dropped."""


class ModelServerError(NemoriError):
    """The local llama.cpp server could not be started or did not become ready."""


class DatasetError(NemoriError):
    """A benchmark dataset file is missing or does not follow its schema."""
