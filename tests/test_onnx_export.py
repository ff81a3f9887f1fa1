"""``python -m nemori_dspy.onnx_export``: a present export is kept, a folder that is no model is refused."""

from __future__ import annotations

import pytest

from nemori_dspy.embedders import find_minilm_dir, find_minilm_onnx_dir
from nemori_dspy.errors import ConfigError
from nemori_dspy.onnx_export import MIN_COSINE, check_against_torch, export_minilm, main

_MINILM = find_minilm_dir(None)
_ONNX = find_minilm_onnx_dir(_MINILM)


def test_not_a_model_folder_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="not a sentence-transformers model folder"):
        export_minilm(tmp_path)
    assert main(["--model", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "onnx").exists()


@pytest.mark.skipif(_ONNX is None, reason="model download: no all-MiniLM-L6-v2/onnx/ folder (.ci/setup writes it)")
def test_present_export_is_kept_and_agrees_with_torch():
    before = (_ONNX / "model.onnx").stat().st_mtime_ns
    assert export_minilm(_MINILM) == _ONNX
    assert (_ONNX / "model.onnx").stat().st_mtime_ns == before
    assert min(check_against_torch(_MINILM, _ONNX)) >= MIN_COSINE
