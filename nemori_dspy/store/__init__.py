"""Memory stores behind one Protocol: ``SQLiteStore`` (embedded default) and ``WeaviateStore``."""

from .base import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore"]
