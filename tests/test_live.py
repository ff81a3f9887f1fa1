"""One short live smoke through the real llama.cpp server and the 0.5B model (opt in: --live).

Checks invariants, not answer quality: messages ingested into exactly one episode each, a question
answered, usage recorded per stage, the server stopped afterwards.
"""

from __future__ import annotations

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.memory import Memory
from nemori_dspy.runtime import build_runtime
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.usage import LEDGER

pytestmark = pytest.mark.live

TURNS = [
    ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful.", "2023-05-08T13:56:00"),
    ("Melanie", "That's great, Caroline! What happened there?", "2023-05-08T13:57:00"),
    ("Caroline", "People shared their transgender stories. I felt accepted.", "2023-05-08T13:58:00"),
    ("Melanie", "I painted a sunrise over the lake last week, it calms me.", "2023-05-08T13:59:00"),
]


def test_live_ingest_and_answer(tmp_path):
    settings = NemoriSettings(model="local", local_model_size="0.5b", window_size=20, max_tokens=256,
                              cache=False, _env_file=None)
    rt = build_runtime(settings, configure=False)
    try:
        with dspy.context(lm=rt.lm, adapter=dspy.ChatAdapter()):
            mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64), settings)
            mem.add_messages("caroline", [{"speaker": s, "content": c, "timestamp": t, "id": f"D1:{i}"}
                                          for i, (s, c, t) in enumerate(TURNS, 1)])
            report = mem.flush("caroline")
            res = mem.answer("caroline", "What did Caroline attend?")
    finally:
        rt.close()
    ids = [m for ep in mem.list_episodes("caroline") for m in ep.message_ids]
    assert sorted(ids) == ["D1:1", "D1:2", "D1:3", "D1:4"], report
    assert isinstance(res.answer, str) and res.answer
    usage = LEDGER.snapshot()
    assert usage["narrate"].calls >= 1 and usage["narrate"].input_tokens > 0
    assert usage["answer"].calls == 1 and res.usage.output_tokens > 0
    assert rt.server is None
