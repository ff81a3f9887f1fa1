"""Hostile sizes: a ~40k-token message is ingested, and no prompt or embedder input exceeds its budget."""

from __future__ import annotations

import dspy
import numpy as np

from nemori_dspy.config import NemoriSettings
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, default_responders


class RecordingEmbedder:
    name, dim = "recording-8", 8

    def __init__(self) -> None:
        self.longest = 0

    def embed(self, texts):
        self.longest = max([self.longest, *map(len, texts)])
        rng = np.random.default_rng(len(texts))
        v = rng.normal(size=(len(texts), 8)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_huge_message_is_ingested_within_prompt_and_embedder_limits(tmp_path, ledger):
    huge = "word " * 160_000  # ~800k chars, far above any context window
    lm = ScriptedLM(default_responders())
    emb = RecordingEmbedder()
    settings = NemoriSettings(window_size=3)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        mem = Memory(SQLiteStore(tmp_path / "m.db"), emb, settings)
        mem.add_messages("u", [{"speaker": "A", "content": "hi", "timestamp": "2023-05-08T10:00:00"},
                               {"speaker": "B", "content": huge, "timestamp": "2023-05-08T10:01:00"},
                               {"speaker": "A", "content": "wow", "timestamp": "2023-05-08T10:02:00"}])
        mem.flush("u")
    stored = [m for ep in mem.list_episodes("u") for m in ep.messages]
    assert len(stored) == 3 and max(len(m.content) for m in stored) == len(huge)  # stored whole
    for _, inputs in lm.prompts:
        assert sum(len(v) for v in inputs.values()) < settings.max_prompt_chars + 2_000
    assert emb.longest <= settings.max_message_chars
    assert ledger.counters.get("embedder_inputs_clipped", 0) >= 1
