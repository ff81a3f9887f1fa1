"""Export the local all-MiniLM-L6-v2 to ONNX once, so the default embedder runs on ONNX Runtime without torch.

usage: ``python -m nemori_dspy.onnx_export [--model DIR] [--force]`` (``.ci/setup`` runs it).

Writes ``DIR/onnx/`` — the Hugging Face Hub layout of the model repo (``onnx/model.onnx``) — holding
``model.onnx`` (the transformer, output ``last_hidden_state``; pooling and L2 normalisation are done by
fastembed at run time, as sentence-transformers' ``1_Pooling`` does) and the tokenizer files, with
``tokenizer_config.json``'s ``model_max_length`` set to sentence-transformers' ``max_seq_length`` (256) so
both routes truncate alike. The export uses torch's own exporter (``torch.onnx.export``, dynamo) and then
checks itself: every probe text must embed within cosine 0.999 of sentence-transformers, else nothing is
written. Export needs the ``onnx-export`` extra (torch, transformers, onnx, onnxscript); running the result
needs only the ``onnx`` extra (fastembed, onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from nemori_dspy.errors import ConfigError

__all__ = ["ONNX_SUBDIR", "MIN_COSINE", "onnx_dir", "export_minilm", "check_against_torch", "main"]

#: folder inside the model folder (the Hub repo's own layout).
ONNX_SUBDIR = "onnx"
#: the least cosine between an ONNX vector and the sentence-transformers one for the same text.
MIN_COSINE = 0.999
_TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json", "config.json", "vocab.txt")
_PROBES = ["When did Caroline go to the LGBTQ support group?", "hi",
           "Melanie painted a sunrise over the lake last summer, then took the kids camping. " * 12]


def onnx_dir(model_dir: str | Path) -> Path:
    """``model_dir/onnx``: where :func:`export_minilm` writes and the ONNX embedder reads."""
    return Path(model_dir) / ONNX_SUBDIR


def _max_seq_length(model_dir: Path) -> int:
    """sentence-transformers' window (``sentence_bert_config.json``; 256 for all-MiniLM-L6-v2)."""
    cfg = model_dir / "sentence_bert_config.json"
    return int(json.loads(cfg.read_text())["max_seq_length"]) if cfg.is_file() else 256


def _export_graph(model_dir: Path, target: Path) -> None:
    """``torch.onnx.export`` of the Hub transformer with dynamic batch and sequence axes."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    class _Hidden(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    model = AutoModel.from_pretrained(model_dir).eval()
    enc = AutoTokenizer.from_pretrained(model_dir)(["a probe", "a longer probe to pad"], padding=True,
                                                    return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=512)
    torch.onnx.export(_Hidden(model), tuple(enc[n] for n in names), str(target), input_names=names,
                      output_names=["last_hidden_state"], dynamic_shapes={n: {0: batch, 1: seq} for n in names},
                      dynamo=True, external_data=False, verbose=False)


def _copy_tokenizer(model_dir: Path, out: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = _max_seq_length(model_dir)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def check_against_torch(model_dir: str | Path, folder: str | Path, texts: list[str] | None = None) -> list[float]:
    """Cosines between the ONNX route (``folder``) and sentence-transformers (``model_dir``), one per text.

    Raises:
        ConfigError: a cosine is below :data:`MIN_COSINE` (the message lists them).
    """
    from nemori_dspy.embedders import OnnxMiniLMEmbedder, SentenceTransformerEmbedder

    texts = texts or _PROBES
    a = OnnxMiniLMEmbedder(folder).embed(texts)
    b = SentenceTransformerEmbedder(model_dir).embed(texts)
    cosines = [float(x) for x in (a * b).sum(axis=1)]
    if min(cosines) < MIN_COSINE:
        raise ConfigError(f"ONNX export of {model_dir} disagrees with sentence-transformers (cosines "
                          f"{[round(c, 5) for c in cosines]}, need >= {MIN_COSINE}). Fix: re-run with --force, "
                          "or set NEMORI_EMBEDDER_BACKEND=torch.")
    return cosines


def export_minilm(model_dir: str | Path, force: bool = False) -> Path:
    """Write ``model_dir/onnx/`` (model.onnx + tokenizer files) unless it is there already; returns that folder.

    Written into a temporary folder beside it, checked with :func:`check_against_torch`, then renamed, so a
    reader never sees half a folder.

    Raises:
        ConfigError: ``model_dir`` is not a model folder, the export libraries are missing, or the check fails.
    """
    model_dir = Path(model_dir).expanduser()
    out = onnx_dir(model_dir)
    if (out / "model.onnx").is_file() and (out / "tokenizer.json").is_file() and not force:
        return out
    if not (model_dir / "config.json").is_file() or not (model_dir / "tokenizer_config.json").is_file():
        raise ConfigError(f"{model_dir} is not a sentence-transformers model folder (config.json, "
                          "tokenizer_config.json). Fix: pass --model DIR or run ../shared/tools/offline-models.")
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter's translator)
        import torch  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"ONNX export needs torch, onnx and onnxscript ({exc}). Fix: pip install "
                          "'nemori-dspy[onnx-export]'.") from exc
    tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=model_dir))
    try:
        _export_graph(model_dir, tmp / "model.onnx")
        _copy_tokenizer(model_dir, tmp)
        check_against_torch(model_dir, tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line of :func:`export_minilm`; prints ``all-MiniLM-L6-v2-onnx=PATH``; exit 2 on a ConfigError."""
    from nemori_dspy.embedders import find_minilm_dir

    ap = argparse.ArgumentParser(prog="python -m nemori_dspy.onnx_export", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (default: the local all-MiniLM-L6-v2 folder the embedder uses)")
    ap.add_argument("--force", action="store_true", help="export again even if onnx/model.onnx exists")
    args = ap.parse_args(argv)
    try:
        model = Path(args.model) if args.model else find_minilm_dir(None)
        if model is None:
            raise ConfigError("no local all-MiniLM-L6-v2 folder found. Fix: pass --model DIR or run "
                              "../shared/tools/offline-models.")
        print(f"all-MiniLM-L6-v2-onnx={export_minilm(model, force=args.force)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
