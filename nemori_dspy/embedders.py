"""Text embedders: turn texts into L2-normalised float32 vectors for cosine search.

Every embedder satisfies :class:`Embedder`: ``embed(texts)`` returns a ``numpy.ndarray`` of
dtype float32 and shape ``(len(texts), dim)`` whose rows have L2 norm 1 (an all-zero row is
left at zero), so cosine similarity is a plain dot product.

* :class:`OnnxMiniLMEmbedder` — the default all-MiniLM-L6-v2 (384-d) on ONNX Runtime through fastembed, no
  torch; reads ``<model folder>/onnx/`` written once by ``python -m nemori_dspy.onnx_export``.
* :class:`SentenceTransformerEmbedder` — local sentence-transformers model (all-MiniLM-L6-v2), CPU, torch.
  Both MiniLM routes give the same vectors (cosine ≥ 0.999, tested) under the same ``name``, so a store
  built with one is read with the other.
* :class:`LiteLLMEmbedder` — any litellm embedding model (``openai/text-embedding-3-small``...).
* :class:`HashingEmbedder` — dependency-free bag-of-words hashing, for tests and offline smoke runs.

Heavy libraries (fastembed/onnxruntime, sentence_transformers/torch, litellm) are imported inside constructors or on
first use, never at module import: ``import nemori_dspy.embedders`` costs only numpy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .errors import ConfigError
from .usage import embedding_call

if TYPE_CHECKING:  # pragma: no cover
    from .config import NemoriSettings

__all__ = [
    "Embedder",
    "SentenceTransformerEmbedder",
    "OnnxMiniLMEmbedder",
    "find_minilm_onnx_dir",
    "LiteLLMEmbedder",
    "HashingEmbedder",
    "resolve_embedder",
    "find_minilm_dir",
    "l2_normalize",
    "MINILM_NAME",
    "MINILM_HUB_ID",
]

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    """What the memory store needs from an embedder.

    Attributes:
        name: stable identifier stored with the vectors (a store built with one embedder refuses
            another of a different name or dim).
        dim: vector dimension (None while unknown: a litellm model without ``dimensions`` learns it
            from its first reply; stores then record it from the first stored vectors).
    """

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows L2-normalised."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Return ``x`` as float32 with each row scaled to L2 norm 1 (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (x / norms).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- hashing
_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """Deterministic bag-of-words hashing embedder with no model and no dependencies beyond numpy.

    Each lowercased word token (``\\w+``) is hashed with BLAKE2b into one of ``dim`` buckets with
    a ±1 sign; counts are summed and the row L2-normalised. Texts sharing words get a high
    cosine, texts sharing none get ~0. Meant for tests and offline smoke runs, not for quality.

    Args:
        dim: number of buckets (vector dimension), > 0.
    """

    def __init__(self, dim: int = 64) -> None:
        if dim <= 0:
            raise ConfigError(f"HashingEmbedder dim must be > 0, got {dim}. Fix: pass e.g. dim=64.")
        self.dim = int(dim)
        self.name = f"hashing-{self.dim}"
        self.truncated = 0

    def _bucket(self, token: str) -> tuple[int, float]:
        h = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
        return h % self.dim, (1.0 if (h >> 63) & 1 else -1.0)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows L2-normalised (empty text → zero row)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with embedding_call(len(texts)):
            for i, t in enumerate(texts):
                for tok in _WORD.findall(t.lower()):
                    j, s = self._bucket(tok)
                    out[i, j] += s
        return l2_normalize(out) if len(texts) else out

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim})"


# --------------------------------------------------------------------------- sentence-transformers
class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU (default all-MiniLM-L6-v2: 384-d, 256-token window).

    ``sentence_transformers`` (and torch) are imported here, in ``__init__``, not at module import.

    Args:
        path_or_name: a local model folder, or a Hub id such as ``sentence-transformers/all-MiniLM-L6-v2``.
        batch_size: texts per forward pass.

    Attributes:
        name: basename of the folder/id, e.g. ``all-MiniLM-L6-v2``.
        dim: embedding dimension reported by the model.
        max_seq_length: model window in tokens (incl. special tokens); longer inputs are truncated.
        truncated: running count of inputs that exceeded ``max_seq_length`` (and were truncated).

    Raises:
        ConfigError: sentence-transformers is missing, or the model cannot be loaded.
    """

    def __init__(self, path_or_name: str | os.PathLike[str] = MINILM_HUB_ID, *, batch_size: int = 64) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            from .errors import MissingExtraError

            raise MissingExtraError("local", "sentence_transformers", f"the local embedder {path_or_name}",
                                    "choose a provider embedder (NEMORI_EMBEDDER=openai/text-embedding-3-small, "
                                    "or --embedder)") from e
        src = str(path_or_name)
        try:
            with _quiet_progress_bars():
                self._model = SentenceTransformer(src, device="cpu")
        except Exception as e:
            raise ConfigError(
                f"could not load the sentence-transformers model {src!r} ({type(e).__name__}: {e}). "
                "Fix: set NEMORI_EMBEDDER_PATH to a local all-MiniLM-L6-v2 folder, or run "
                "../shared/tools/offline-models."
            ) from e
        self.source = src
        self.name = Path(src.rstrip("/\\")).name or src
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.max_seq_length = int(self._model.max_seq_length or 0)
        self.batch_size = batch_size
        self.truncated = 0

    def _count_truncated(self, texts: list[str]) -> int:
        """Inputs longer than ``max_seq_length`` tokens (incl. [CLS]/[SEP]).

        Cheap: a WordPiece token spans at least one character, so only texts with more than
        ``max_seq_length - 2`` characters can overflow; only those are tokenized.
        """
        if not self.max_seq_length:
            return 0
        cands = [t for t in texts if len(t) > self.max_seq_length - 2]
        if not cands:
            return 0
        tok = self._model.tokenizer
        try:
            ids = tok(cands, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        except TypeError:
            ids = tok(cands, add_special_tokens=True, truncation=False)["input_ids"]
        return sum(1 for x in ids if len(x) > self.max_seq_length)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows L2-normalised.

        Inputs beyond ``max_seq_length`` tokens are truncated by the model; ``self.truncated``
        is incremented by their number.
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.truncated += self._count_truncated(texts)
        with embedding_call(len(texts)):
            vecs = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vecs, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.source!r}, dim={self.dim})"

    backend = "torch"


class _quiet_progress_bars:
    """Silence transformers' "Loading weights" progress bar while a model loads, then restore it."""

    def __enter__(self) -> None:
        try:
            from transformers.utils import logging as hf_logging

            self._hf = hf_logging
            self._was = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        except Exception:  # pragma: no cover - older/newer transformers
            self._hf = None

    def __exit__(self, *exc: object) -> None:
        if self._hf is not None and self._was:
            self._hf.enable_progress_bar()


# --------------------------------------------------------------------------- ONNX Runtime (fastembed)
class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime through fastembed (mean pooling + L2 norm, as sentence-transformers).

    No torch: ``fastembed`` (onnxruntime + tokenizers) is imported here, in ``__init__``. The folder is the
    one ``python -m nemori_dspy.onnx_export`` writes (``model.onnx``, ``tokenizer.json``,
    ``tokenizer_config.json`` with ``model_max_length`` 256). Vectors match
    :class:`SentenceTransformerEmbedder`'s within cosine 0.999, so ``name`` is the same
    (``all-MiniLM-L6-v2``) and stores built by either route stay valid; ``backend`` tells them apart.

    Args:
        folder: the ONNX folder (``<model folder>/onnx``).
        threads: ONNX Runtime intra-op threads (None: onnxruntime's default, the machine's cores).
        batch_size: texts per forward pass.

    Attributes:
        name, dim (384), max_seq_length (tokens incl. specials), truncated (inputs cut at the window),
        backend (``"onnx"``).

    Raises:
        ConfigError: fastembed is missing, or the folder lacks ``model.onnx`` / ``tokenizer.json``.
    """

    backend = "onnx"

    def __init__(self, folder: str | os.PathLike[str], *, threads: int | None = None, batch_size: int = 64) -> None:
        folder = Path(folder)
        if not (folder / "model.onnx").is_file() or not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"no ONNX model in {folder} (model.onnx, tokenizer.json). Fix: run "
                              "python -m nemori_dspy.onnx_export, or set NEMORI_EMBEDDER_BACKEND=torch.")
        try:
            from fastembed import TextEmbedding
            from tokenizers import Tokenizer
        except ImportError as e:
            from .errors import MissingExtraError

            raise MissingExtraError("onnx", "fastembed", "the ONNX route of all-MiniLM-L6-v2",
                                    "set NEMORI_EMBEDDER_BACKEND=torch") from e
        self._model = TextEmbedding(MINILM_HUB_ID, specific_model_path=str(folder), threads=threads)
        self._counter = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._counter.no_truncation()
        self._counter.no_padding()
        import json

        self.max_seq_length = int(json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"])
        self._folder, self._one, self._threads = folder, None, threads
        self.source = str(folder)
        self.name = MINILM_NAME
        self.dim = 384
        self.batch_size = batch_size
        self.truncated = 0

    def _count_truncated(self, texts: list[str]) -> int:
        """Inputs longer than ``max_seq_length`` tokens; only texts longer than that in characters are tokenized."""
        cands = [t for t in texts if len(t) > self.max_seq_length - 2]
        if not cands:
            return 0
        return sum(1 for enc in self._counter.encode_batch(cands) if len(enc.ids) > self.max_seq_length)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), 384)``, rows L2-normalised (inputs past 256 tokens
        are truncated and counted in ``self.truncated``)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.truncated += self._count_truncated(texts)
        with embedding_call(len(texts)):
            if len(texts) == 1:  # a query: one short text, where fastembed's per-call overhead is most of the time
                return self._single(texts[0])[None, :]
            vecs = np.stack(list(self._model.embed(list(texts), batch_size=self.batch_size)))
        return np.asarray(vecs, dtype=np.float32)

    def _single(self, text: str) -> np.ndarray:
        """One text through the same ``model.onnx`` with ONNX Runtime directly (``threads`` intra-op threads, the
        machine's cores by default): tokenize, run, mean-pool over the attention mask, L2-normalise — what
        fastembed does for this model, without its batching machinery, so one query costs less than through
        fastembed (``benchmarks.query_embedding``; docs/decisions.md); the vectors agree to cosine > 0.9999 (``tests/test_embedders.py``)."""
        if self._one is None:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            opts = ort.SessionOptions()
            if self._threads:
                opts.intra_op_num_threads = self._threads
            session = ort.InferenceSession(str(self._folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
            tok = Tokenizer.from_file(str(self._folder / "tokenizer.json"))
            tok.no_padding()
            tok.enable_truncation(self.max_seq_length)
            self._one = (session, tok, {i.name for i in session.get_inputs()})
        session, tok, names = self._one
        enc = tok.encode(text)
        ids = np.asarray([enc.ids], dtype=np.int64)
        mask = np.asarray([enc.attention_mask], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = session.run(None, feed)[0][0]  # (tokens, 384)
        v = (hidden * mask[0][:, None]).sum(axis=0) / max(int(mask.sum()), 1)
        return (v / (np.linalg.norm(v) or 1.0)).astype(np.float32)

    def __repr__(self) -> str:
        return f"OnnxMiniLMEmbedder({self.source!r}, dim={self.dim})"


# --------------------------------------------------------------------------- litellm
class LiteLLMEmbedder:
    """Any litellm embedding model, e.g. ``openai/text-embedding-3-small`` or ``ollama/nomic-embed-text``.

    No network call happens in ``__init__``. ``dim`` is ``dimensions`` when given, otherwise it
    is discovered from the first :meth:`embed` call (``None`` until then).

    Args:
        model: litellm model string.
        api_base: base URL of the provider (None = litellm's default / env).
        api_key: API key (None = provider env var such as OPENAI_API_KEY).
        dimensions: requested output dimension, for models that support it.
        batch_size: texts per request.
        timeout_s: per-request timeout in seconds.

    Raises (from :meth:`embed`):
        ConfigError: litellm is missing, or the provider returned a dimension different from
            the one already established.
        Exception: provider errors from litellm propagate unchanged (the caller decides on retries).
    """

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        api_key: str | None = None,
        *,
        dimensions: int | None = None,
        batch_size: int = 128,
        timeout_s: float = 120.0,
    ) -> None:
        self.model = model
        self.name = model
        self.api_base = api_base
        self._api_key = api_key
        self.dimensions = dimensions
        self.dim: int | None = dimensions  # type: ignore[assignment]
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.truncated = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows L2-normalised."""
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        try:
            import litellm
        except ImportError as e:  # pragma: no cover - dependency is declared
            raise ConfigError("litellm is not installed. Fix: pip install litellm.") from e
        kw: dict[str, Any] = {"model": self.model, "timeout": self.timeout_s}
        if self.api_base:
            kw["api_base"] = self.api_base
        if self._api_key:
            kw["api_key"] = self._api_key
        if self.dimensions:
            kw["dimensions"] = self.dimensions
        rows: list[list[float]] = []
        with embedding_call(len(texts)) as used:
            for i in range(0, len(texts), self.batch_size):
                # Most providers reject empty strings; a single space embeds "nothing".
                batch = [t if t.strip() else " " for t in texts[i : i + self.batch_size]]
                resp = litellm.embedding(input=batch, **kw)
                data = sorted(resp.data, key=lambda d: _get(d, "index", 0))
                rows.extend(_get(d, "embedding") for d in data)
                used["tokens"] += int(_get(_get(resp, "usage") or {}, "prompt_tokens", 0) or 0)
                used["cost"] += float((getattr(resp, "_hidden_params", None) or {}).get("response_cost") or 0.0)
        arr = np.asarray(rows, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != len(texts):
            raise ConfigError(
                f"embedding model {self.model!r} returned shape {arr.shape} for {len(texts)} texts. "
                "Fix: check that the model string names an embedding model."
            )
        if self.dim is None:
            self.dim = int(arr.shape[1])
        elif arr.shape[1] != self.dim:
            raise ConfigError(
                f"embedding model {self.model!r} returned {arr.shape[1]}-d vectors, expected {self.dim}. "
                "Fix: use the same model/dimensions the store was built with."
            )
        return l2_normalize(arr)

    def __repr__(self) -> str:
        return f"LiteLLMEmbedder({self.model!r}, dim={self.dim})"


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


# --------------------------------------------------------------------------- resolution
def find_minilm_dir(settings: "NemoriSettings | None" = None) -> Path | None:
    """First existing local all-MiniLM-L6-v2 folder, or None.

    Order: ``settings.embedder_path``, ``settings.models_dir/all-MiniLM-L6-v2``,
    ``$NEMORI_OFFLINE_MODELS/all-MiniLM-L6-v2``, ``~/.cache/nemori-offline-models/all-MiniLM-L6-v2``.

    Raises:
        ConfigError: ``settings.embedder_path`` is set but is not a folder.
    """
    if settings is not None and settings.embedder_path is not None:
        p = Path(settings.embedder_path).expanduser()
        if not p.is_dir():
            raise ConfigError(
                f"embedder folder not found: {p} (from embedder_path / NEMORI_EMBEDDER_PATH). "
                "Fix: point it at a sentence-transformers folder (config.json, modules.json, "
                "model.safetensors), unset it, or run ../shared/tools/offline-models."
            )
        return p
    cands: list[Path] = []
    if settings is not None and settings.models_dir is not None:
        cands.append(Path(settings.models_dir).expanduser() / MINILM_NAME)
    env = os.environ.get("NEMORI_OFFLINE_MODELS")
    if env:
        cands.append(Path(env).expanduser() / MINILM_NAME)
    cands.append(Path.home() / ".cache" / "nemori-offline-models" / MINILM_NAME)
    for c in cands:
        if c.is_dir() and (c / "config.json").is_file():
            return c
    return None


def find_minilm_onnx_dir(model_dir: Path | None) -> Path | None:
    """``model_dir/onnx`` when it holds ``model.onnx`` and ``tokenizer.json`` (see ``nemori_dspy.onnx_export``)."""
    if model_dir is None:
        return None
    folder = Path(model_dir) / "onnx"
    return folder if (folder / "model.onnx").is_file() and (folder / "tokenizer.json").is_file() else None


def _minilm(settings: "NemoriSettings") -> Embedder:
    """The MiniLM route ``settings.embedder_backend`` picks: ``onnx``, ``torch``, or ``auto`` (ONNX when its
    folder and fastembed are there, else sentence-transformers, logged once at INFO)."""
    folder = find_minilm_dir(settings)
    backend = settings.embedder_backend
    if backend != "torch":
        onnx = find_minilm_onnx_dir(folder)
        if backend == "onnx" or (onnx is not None and importlib.util.find_spec("fastembed") is not None):
            if onnx is None:
                raise ConfigError(f"embedder_backend=onnx but no ONNX model under {folder or MINILM_NAME}. Fix: run "
                                  "python -m nemori_dspy.onnx_export, or set NEMORI_EMBEDDER_BACKEND=torch.")
            return OnnxMiniLMEmbedder(onnx)
        _log.info("all-MiniLM-L6-v2 on sentence-transformers (torch): %s", "no onnx/ folder (python -m "
                  "nemori_dspy.onnx_export writes it)" if onnx is None else "fastembed is not installed")
    return SentenceTransformerEmbedder(folder if folder is not None else MINILM_HUB_ID)


def resolve_embedder(settings: "NemoriSettings") -> Embedder:
    """Build the embedder ``settings.embedder`` names.

    * ``"all-MiniLM-L6-v2"`` (or ``sentence-transformers/all-MiniLM-L6-v2``) → on the first local folder (see
      :func:`find_minilm_dir`): :class:`OnnxMiniLMEmbedder` on its ``onnx/`` subfolder, or
      :class:`SentenceTransformerEmbedder` (folder, else the Hub id), as ``settings.embedder_backend`` says.
    * ``"sentence-transformers/<model>"`` (e.g. ``sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2``,
      384-d, 50+ languages) → :class:`SentenceTransformerEmbedder` on ``settings.embedder_path`` if set,
      else the Hub id.
    * ``"hashing"`` / ``"hashing-<dim>"`` → :class:`HashingEmbedder` (tests, offline smoke runs).
    * anything else → :class:`LiteLLMEmbedder` (no network call until the first embed). It reuses
      ``settings.api_base`` / ``api_key`` only when the chat model is not the embedded ``local``
      server (which serves no embeddings).

    Raises:
        ConfigError: the local model folder is invalid or cannot be loaded; ``embedder_backend="onnx"``
            without an ONNX folder or fastembed.
    """
    name = settings.embedder.strip()
    if name in (MINILM_NAME, MINILM_HUB_ID):
        return _minilm(settings)
    if name.startswith("sentence-transformers/"):  # e.g. the multilingual paraphrase-multilingual-MiniLM-L12-v2
        return SentenceTransformerEmbedder(settings.embedder_path or name)
    m = re.fullmatch(r"hashing(?:-(\d+))?", name)
    if m:
        return HashingEmbedder(int(m.group(1) or 64))
    use_server = settings.model != "local"
    api_key = settings.api_key.get_secret_value() if (use_server and settings.api_key) else None
    return LiteLLMEmbedder(name, api_base=settings.api_base if use_server else None, api_key=api_key)
