"""Chart smoke tests: the PNG files exist, have the PNG signature and are not trivially small."""

from __future__ import annotations

from pathlib import Path

from nemori_dspy.eval.charts import category_bar_chart, cost_by_stage_chart
from nemori_dspy.types import Usage

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    assert path.exists()
    data = path.read_bytes()
    assert data[:8] == _PNG_MAGIC
    assert len(data) > 5_000


def test_category_bar_chart(tmp_path):
    rows = [{"category": c, "system": s, "f1": v}
            for c in (1, 2, 3, 4, 5) for s, v in (("nemori", 0.6), ("no-memory", 0.2))]
    rows += [{"category": 1, "system": "nemori", "f1": 0.2}, {"category": 2, "system": "rag", "f1": None}]
    out = category_bar_chart(rows, "f1", ["nemori", "no-memory", "rag"], tmp_path / "sub" / "f1.png")
    assert out == tmp_path / "sub" / "f1.png"
    _assert_png(out)
    _assert_png(category_bar_chart(rows, "f1", None, str(tmp_path / "all.png")))


def test_cost_by_stage_chart(tmp_path):
    usage = {"answer": {"calls": 4, "input_tokens": 2000, "output_tokens": 100},
             "narrate": Usage(calls=2, input_tokens=5000, output_tokens=900),
             "partition": {"calls": 1, "input_tokens": 0, "output_tokens": 0}}
    out = cost_by_stage_chart(usage, tmp_path / "cost.png", stages_order=["partition", "narrate"])
    _assert_png(out)
