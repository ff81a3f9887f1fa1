"""Embedders: the hashing embedder, resolution, and the local MiniLM model when present."""

from __future__ import annotations


import numpy as np
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import (
    Embedder,
    HashingEmbedder,
    LiteLLMEmbedder,
    find_minilm_dir,
    resolve_embedder,
)


def test_hashing_shapes_norms_determinism():
    e = HashingEmbedder(dim=64)
    assert e.name == "hashing-64" and e.dim == 64
    assert isinstance(e, Embedder)
    v = e.embed(["Alice went hiking in the Alps", "Bob likes jazz", ""])
    assert v.dtype == np.float32 and v.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(v[:2], axis=1), 1.0, atol=1e-6)
    assert np.all(v[2] == 0)  # empty text: zero row, no NaN
    np.testing.assert_array_equal(v, HashingEmbedder(dim=64).embed(["Alice went hiking in the Alps", "Bob likes jazz", ""]))
    assert e.embed([]).shape == (0, 64)


def test_hashing_similar_texts_closer():
    e = HashingEmbedder(dim=256)
    a, b, c = e.embed([
        "Caroline went to the LGBTQ support group on Sunday",
        "On Sunday Caroline went to a support group",
        "Melanie painted a sunrise over the lake",
    ])
    assert a @ b > a @ c
    assert a @ b > 0.5


def test_resolve_litellm_embedder_no_network(monkeypatch):
    import sys

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("network call during resolve_embedder")

    if "litellm" in sys.modules:
        monkeypatch.setattr(sys.modules["litellm"], "embedding", boom)
    s = NemoriSettings(embedder="openai/text-embedding-3-small", _env_file=None)
    e = resolve_embedder(s)
    assert isinstance(e, LiteLLMEmbedder)
    assert e.name == "openai/text-embedding-3-small"
    assert e.api_base is None  # the embedded 'local' chat server serves no embeddings


def test_resolve_hashing():
    e = resolve_embedder(NemoriSettings(embedder="hashing-32", _env_file=None))
    assert isinstance(e, HashingEmbedder) and e.dim == 32


def test_resolve_a_sentence_transformers_model_such_as_the_multilingual_one(monkeypatch, tmp_path):
    import nemori_dspy.embedders as emb

    made = []
    monkeypatch.setattr(emb, "SentenceTransformerEmbedder", lambda path: made.append(path) or "st")
    name = "sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2"
    assert resolve_embedder(NemoriSettings(embedder=name, _env_file=None)) == "st"
    assert resolve_embedder(NemoriSettings(embedder=name, embedder_path=tmp_path, _env_file=None)) == "st"
    assert made == [name, tmp_path]   # the Hub id, or the local folder when embedder_path is set


def test_resolve_missing_embedder_path_errors(tmp_path):
    from nemori_dspy.errors import ConfigError

    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=str(missing)):
        resolve_embedder(NemoriSettings(embedder_path=missing, _env_file=None))


_MINILM = find_minilm_dir(None)


# a model download, not test data: ~/.cache/nemori-offline-models/all-MiniLM-L6-v2 (or $NEMORI_OFFLINE_MODELS) is
# filled by .ci/setup from ../shared, or by hand from the Hub (sentence-transformers/all-MiniLM-L6-v2)
@pytest.mark.skipif(_MINILM is None, reason="model download: local all-MiniLM-L6-v2 folder not found "
                    "(~/.cache/nemori-offline-models or $NEMORI_OFFLINE_MODELS; see docs/evaluation.md)")
def test_sentence_transformer_minilm():
    from nemori_dspy.embedders import SentenceTransformerEmbedder

    e = SentenceTransformerEmbedder(_MINILM)
    assert e.name == "all-MiniLM-L6-v2" and e.dim == 384
    v = e.embed(["The cat sat on the mat.", "A cat was sitting on a rug."])
    assert v.shape == (2, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    w = e.embed(["The cat sat on the mat.", "Quarterly tax filings are due in April."])
    assert float(v[0] @ v[1]) > float(w[0] @ w[1])
    assert e.truncated == 0
    e.embed(["word " * 400, "short"])
    assert e.truncated == 1


_ONNX = None
if _MINILM is not None:
    from nemori_dspy.embedders import find_minilm_onnx_dir

    _ONNX = find_minilm_onnx_dir(_MINILM)
_needs_onnx = pytest.mark.skipif(_ONNX is None, reason="model download: no all-MiniLM-L6-v2/onnx/ folder (written by "
                                 "python -m nemori_dspy.onnx_export, which .ci/setup runs)")
_TEXTS = ["When did Caroline go to the LGBTQ support group?", "hi", "",
          "Melanie painted a sunrise over the lake last summer with her kids. " * 40,  # past the 256-token window
          "Über-naïve café owners in São Paulo prefer 12:30 lunches.", "The cat sat on the mat."]


@_needs_onnx
def test_onnx_route_matches_sentence_transformers():
    from nemori_dspy.embedders import OnnxMiniLMEmbedder, SentenceTransformerEmbedder

    onnx, torch_route = OnnxMiniLMEmbedder(_ONNX), SentenceTransformerEmbedder(_MINILM)
    assert (onnx.name, onnx.dim, onnx.backend) == (torch_route.name, torch_route.dim, "onnx")  # stores stay valid
    a, b = onnx.embed(_TEXTS), torch_route.embed(_TEXTS)
    assert a.shape == b.shape == (len(_TEXTS), 384) and a.dtype == np.float32
    nonzero = [i for i, t in enumerate(_TEXTS) if t]
    assert float(((a * b).sum(axis=1)[nonzero]).min()) >= 0.999
    assert onnx.truncated == torch_route.truncated == 1
    assert onnx.embed([]).shape == (0, 384)


@_needs_onnx
def test_a_single_query_through_onnx_runtime_directly_equals_the_batch_vector():
    from nemori_dspy.embedders import OnnxMiniLMEmbedder

    onnx = OnnxMiniLMEmbedder(_ONNX)
    batch = onnx.embed(_TEXTS)
    one = np.stack([onnx.embed([t])[0] for t in _TEXTS])  # the query path: one text, no fastembed batching
    assert one.shape == batch.shape and float((batch * one).sum(axis=1).min()) > 0.9999
    assert np.allclose(np.linalg.norm(one, axis=1), 1.0, atol=1e-5) and onnx.truncated == 2  # the long text, twice


@_needs_onnx
def test_auto_backend_resolves_to_onnx_and_torch_on_request():
    from nemori_dspy.embedders import OnnxMiniLMEmbedder, SentenceTransformerEmbedder

    assert isinstance(resolve_embedder(NemoriSettings(embedder_path=_MINILM, _env_file=None)), OnnxMiniLMEmbedder)
    forced = resolve_embedder(NemoriSettings(embedder_path=_MINILM, embedder_backend="torch", _env_file=None))
    assert isinstance(forced, SentenceTransformerEmbedder)


@_needs_onnx
def test_default_embedder_needs_no_torch():
    """A fresh interpreter resolves the default embedder and embeds a query without importing torch."""
    import subprocess
    import sys

    code = ("import sys\nfrom nemori_dspy.config import NemoriSettings\nfrom nemori_dspy.embedders import "
            "resolve_embedder\ne = resolve_embedder(NemoriSettings(embedder_path=sys.argv[1], _env_file=None))\n"
            "e.embed(['a query'])\nprint(type(e).__name__, 'torch' in sys.modules, 'sentence_transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(_MINILM)], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["OnnxMiniLMEmbedder", "False", "False"], done.stderr[-2000:]


def test_onnx_backend_without_onnx_folder_errors(tmp_path):
    from nemori_dspy.errors import ConfigError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="onnx_export"):
        resolve_embedder(NemoriSettings(embedder_path=tmp_path, embedder_backend="onnx", _env_file=None))
