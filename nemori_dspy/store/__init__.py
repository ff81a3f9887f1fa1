"""Memory stores behind one Protocol: ``SQLiteStore`` (embedded default) and ``WeaviateStore``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .base import MemoryStore
from .sqlite import SQLiteStore
from .weaviate import DEFAULT_PREFIX, WeaviateStore

if TYPE_CHECKING:
    from ..config import NemoriSettings

__all__ = ["MemoryStore", "SQLiteStore", "WeaviateStore", "open_store"]


def open_store(settings: "NemoriSettings", path: str | Path | None = None) -> MemoryStore:
    """The store ``settings.store`` names: ``SQLiteStore(path or settings.db_path)``, or a
    ``WeaviateStore`` on ``settings.weaviate_url`` whose collection prefix is derived from ``path``'s
    file stem (so each eval construction key gets its own collections; no path → ``"Nemori"``).

    Raises:
        ConfigError: ``store="weaviate"`` without ``weaviate_url``, or weaviate-client is missing.
        StoreError: the Weaviate server cannot be reached.
    """
    if settings.store == "sqlite":
        return SQLiteStore(path if path is not None else settings.db_path, naive_timezone=settings.naive_timezone,
                           lexical_weight=settings.lexical_weight)
    if not settings.weaviate_url:
        raise ConfigError("store='weaviate' needs a server URL. Fix: set NEMORI_WEAVIATE_URL "
                          "(e.g. http://localhost:8080), or set NEMORI_STORE=sqlite.")
    prefix = DEFAULT_PREFIX
    if path is not None:
        prefix += "_" + re.sub(r"[^0-9A-Za-z]", "_", Path(path).stem)[:64]
    return WeaviateStore(settings.weaviate_url, prefix=prefix, naive_timezone=settings.naive_timezone,
                         lexical_weight=settings.lexical_weight)
