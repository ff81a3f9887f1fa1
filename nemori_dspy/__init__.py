"""nemori-dspy: Nemori long-term memory (arXiv 2508.03341) as a declarative, optimizable DSPy pipeline.

The public names below are loaded on first use (PEP 562 ``__getattr__``): ``import nemori_dspy`` — and
with it ``nemori-dspy --help`` — costs no dspy, litellm or torch import; ``nemori_dspy.Memory`` pulls them.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# litellm must not fetch its price table from the network at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .config import NemoriSettings
    from .errors import (ConfigError, DatasetError, EmbedderMismatchError, InvalidInputError, LLMError,
                         ModelServerError, NemoriError, NotFoundError, RateLimitedError, StoreError,
                         UnknownUserError)
    from .memory import AddResult, Memory
    from .types import (AnswerResult, DeleteMessageResult, Episode, ForgetResult, Message, SearchResult,
                        SemanticEntry)

__version__ = "0.1.0"

#: public name → the submodule that defines it (imported on first attribute access).
_LAZY = {
    "Memory": "memory", "AddResult": "memory",
    "NemoriSettings": "config",
    "Message": "types", "Episode": "types", "SemanticEntry": "types", "SearchResult": "types",
    "AnswerResult": "types", "ForgetResult": "types", "DeleteMessageResult": "types",
    **{name: "errors" for name in ("NemoriError", "InvalidInputError", "UnknownUserError", "NotFoundError",
                                   "ConfigError", "EmbedderMismatchError", "StoreError", "LLMError",
                                   "RateLimitedError", "ModelServerError", "DatasetError")},
}

__all__ = [
    "Memory",
    "AddResult",
    "NemoriSettings",
    "Message",
    "Episode",
    "SemanticEntry",
    "SearchResult",
    "AnswerResult",
    "ForgetResult",
    "DeleteMessageResult",
    "NemoriError",
    "InvalidInputError",
    "UnknownUserError",
    "NotFoundError",
    "ConfigError",
    "EmbedderMismatchError",
    "StoreError",
    "LLMError",
    "RateLimitedError",
    "ModelServerError",
    "DatasetError",
]


def __getattr__(name: str) -> Any:
    """Import the submodule behind a public name on first access and cache the name here.

    Raises:
        AttributeError: ``name`` is not a public name of the package (nor a submodule already imported).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nemori_dspy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
