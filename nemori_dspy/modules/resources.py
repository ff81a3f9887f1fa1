"""Shared, non-copied resources handed to modules: store, embedder and settings (one set per ``Memory``)."""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np

from ..config import NemoriSettings
from ..embedders import Embedder
from ..store.base import MemoryStore
from ..usage import tally

__all__ = ["Resources"]


@dataclass
class Resources:
    """What a module needs besides its predictors. Deep copies (DSPy optimizers copy programs)
    share the same store and embedder instead of duplicating connections or model weights."""

    store: MemoryStore
    embedder: Embedder
    settings: NemoriSettings = field(default_factory=NemoriSettings)

    def __deepcopy__(self, memo: dict) -> "Resources":
        return self

    def embed(self, text: str) -> list[float]:
        """One text → unit vector (list of ``embedder.dim`` floats)."""
        return self.embed_many([text])[0]

    def embed_many(self, texts: list[str]) -> list[list[float]]:
        """Texts → unit vectors, clipped to ``settings.max_message_chars`` characters each."""
        if not texts:
            return []
        cap = self.settings.max_message_chars
        clipped = [t[:cap] for t in texts]
        if any(len(t) > cap for t in texts):
            tally("embedder_inputs_clipped", sum(len(t) > cap for t in texts))
        arr = np.asarray(self.embedder.embed(clipped), dtype=np.float32)
        return arr.tolist()

