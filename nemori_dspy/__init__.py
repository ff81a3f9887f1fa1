"""nemori-dspy: Nemori long-term memory (arXiv 2508.03341) as a declarative, optimizable DSPy pipeline."""

from __future__ import annotations

import os

# litellm must not fetch its price table from the network at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from .config import NemoriSettings  # noqa: E402
from .errors import (  # noqa: E402
    ConfigError,
    DatasetError,
    EmbedderMismatchError,
    InvalidInputError,
    LLMError,
    ModelServerError,
    NemoriError,
    NotFoundError,
    StoreError,
    UnknownUserError,
)
from .memory import AddResult, Memory  # noqa: E402
from .types import AnswerResult, Episode, Message, SearchResult, SemanticEntry  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Memory",
    "AddResult",
    "NemoriSettings",
    "Message",
    "Episode",
    "SemanticEntry",
    "SearchResult",
    "AnswerResult",
    "NemoriError",
    "InvalidInputError",
    "UnknownUserError",
    "NotFoundError",
    "ConfigError",
    "EmbedderMismatchError",
    "StoreError",
    "LLMError",
    "ModelServerError",
    "DatasetError",
]
