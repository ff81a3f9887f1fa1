"""The embedded local LLM: find a Qwen2.5-Coder GGUF and serve it with llama.cpp's OpenAI server.

``model="local"`` in :class:`~nemori_dspy.config.NemoriSettings` means: resolve a GGUF file with
:func:`resolve_gguf`, start ``python -m llama_cpp.server`` on it with :class:`LlamaServer`, and
point litellm at ``openai/local-<gguf stem>`` (:func:`server_alias`) on ``LlamaServer.api_base``.

Only the standard library and ``httpx`` are imported at module import; ``huggingface_hub`` is
imported when a download is actually needed.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import NemoriSettings
from .errors import ConfigError, ModelServerError

__all__ = [
    "resolve_gguf",
    "default_gguf_name",
    "f16_copy",
    "offline_models_dirs",
    "LlamaServer",
    "server_alias",
    "HUB_REPOS",
    "OFFLINE_MODELS_ENV",
]

#: Env var that overrides where ../shared/tools/offline-models puts (and we look for) model files.
OFFLINE_MODELS_ENV = "NEMORI_OFFLINE_MODELS"

#: Hugging Face Hub repos holding the default GGUFs, keyed by ``local_model_size``.
HUB_REPOS = {
    "0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    "1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
}

_FIX_HINT = (
    "Fix: set NEMORI_GGUF (or --gguf) to a local .gguf file, or NEMORI_MODELS_DIR (or --models-dir) "
    "to a folder holding it, or run ../shared/tools/offline-models to assemble the local models "
    "into ~/.cache/nemori-offline-models."
)


def default_gguf_name(size: str) -> str:
    """File name of the default GGUF for ``size`` ('0.5b' or '1.5b'), e.g. ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``."""
    return f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"


def offline_models_dirs(settings: NemoriSettings | None = None) -> list[Path]:
    """Folders searched for local model files, in order of priority.

    ``settings.models_dir``, then ``$NEMORI_OFFLINE_MODELS``, then ``~/.cache/nemori-offline-models``
    (duplicates removed; folders are not required to exist).
    """
    dirs: list[Path] = []
    if settings is not None and settings.models_dir is not None:
        dirs.append(Path(settings.models_dir).expanduser())
    env = os.environ.get(OFFLINE_MODELS_ENV)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(Path.home() / ".cache" / "nemori-offline-models")
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def _hub_download(repo_id: str, filename: str) -> Path:
    from .extras import require

    hf_hub_download = require("huggingface_hub", f"downloading {repo_id}/{filename}").hf_hub_download
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    except Exception as e:  # network errors, 404, gated repos...
        raise ConfigError(
            f"could not download {filename} from the Hugging Face Hub repo {repo_id} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e!r}). {_FIX_HINT}"
        ) from e


def resolve_gguf(settings: NemoriSettings) -> Path:
    """Return the path of the GGUF file the embedded server should load.

    Order:
      1. ``settings.gguf`` as ``hf:<owner>/<repo>/<filename>`` → downloaded with ``hf_hub_download``;
      2. ``settings.gguf`` as a path → must exist;
      3. ``qwen2.5-coder-{local_model_size}-instruct-q4_k_m.gguf`` in ``settings.models_dir``,
         ``$NEMORI_OFFLINE_MODELS``, ``~/.cache/nemori-offline-models``;
      4. the same file from the Hub repo ``Qwen/Qwen2.5-Coder-{0.5B,1.5B}-Instruct-GGUF``;
      and for 3-4, when ``local_model_size`` is in ``settings.local_f16``, its F16 copy (:func:`f16_copy`).

    Raises:
        ConfigError: the given path does not exist, the ``hf:`` spec is malformed, or the
            download failed (e.g. no internet); the message says how to fix it.
        ModelServerError: the F16 copy could not be written (see :func:`f16_copy`).
    """
    if settings.gguf:
        spec = settings.gguf.strip()
        if spec.startswith("hf:"):
            parts = spec[3:].strip("/").split("/")
            if len(parts) < 3:
                raise ConfigError(
                    f"gguf={spec!r} is not of the form 'hf:<owner>/<repo>/<filename>'. "
                    "Fix: e.g. hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
                )
            return _hub_download("/".join(parts[:2]), "/".join(parts[2:]))
        p = Path(spec).expanduser()
        if not p.is_file():
            raise ConfigError(
                f"GGUF file not found: {p} (from gguf / NEMORI_GGUF / --gguf). "
                f"Fix: point it at an existing .gguf file, or unset it to use the default "
                f"{default_gguf_name(settings.local_model_size)} (see ../shared/tools/offline-models)."
            )
        return p.resolve()

    name = default_gguf_name(settings.local_model_size)
    found = next((d / name for d in offline_models_dirs(settings) if (d / name).is_file()), None)
    path = found.resolve() if found else _hub_download(HUB_REPOS[settings.local_model_size], name)
    if settings.local_model_size in settings.local_f16:
        return f16_copy(path, fallback_dir=Path(settings.cache_dir).expanduser() / "models")
    return path


def f16_copy(src: Path, fallback_dir: Path | None = None) -> Path:
    """The F16 copy of the GGUF ``src``: ``<stem>-f16.gguf`` beside it (or in ``fallback_dir`` when ``src``'s
    folder is not writable), written with llama.cpp's quantizer when missing or older than ``src``, else reused.

    The copy holds ``src``'s weights dequantized and rounded to fp16 (Q4_K_M → F16: ~2.6x the bytes, the same model to
    fp16 rounding). llama.cpp's CPU matrix kernels prefill the 0.5B faster from F16 (``NemoriSettings.local_f16``,
    ``python -m benchmarks.gguf_encoding``). Written to a temporary name and renamed, so a crash or a second process
    never leaves a half-written file under the final name.

    Raises:
        MissingExtraError: llama-cpp-python (the ``local`` extra) is not installed.
        ModelServerError: llama.cpp's quantizer failed, or neither folder is writable; the message says how to
            serve the file as it is.
    """
    out_dir = src.parent if os.access(src.parent, os.W_OK) else fallback_dir
    if out_dir is None:
        raise ModelServerError(f"cannot write the F16 copy of {src}: its folder is not writable. "
                               "Fix: set NEMORI_LOCAL_F16='[]' to serve the file as it is, or copy it somewhere writable.")
    out = out_dir / f"{src.stem}-f16.gguf"
    if out.is_file() and out.stat().st_size > 0 and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"nemori: writing {out} (the F16 copy of {src.name}, once; NEMORI_LOCAL_F16='[]' serves the file as it is)",
          file=sys.stderr)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=".part", dir=out_dir)
    os.close(fd)
    try:
        _quantize_f16(src, Path(tmp))
        shutil.copymode(src, tmp)  # mkstemp made it private; readable as the source is
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _quantize_f16(src: Path, dst: Path) -> None:
    """Write ``src``'s weights to ``dst`` as F16 with ``llama_model_quantize``, llama.cpp's per-tensor log held back.

    Raises:
        MissingExtraError: llama-cpp-python is not installed.
        ModelServerError: the quantizer returned non-zero.
    """
    from .extras import require

    llama_cpp = require("llama_cpp", "the embedded model's F16 copy (local_f16)", "local")
    llama_log = logging.getLogger("llama-cpp-python")  # llama.cpp's log callback prints below this logger's level
    level = llama_log.level
    llama_log.setLevel(logging.ERROR)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_F16, True
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    finally:
        llama_log.setLevel(level)
    if rc != 0:
        raise ModelServerError(f"llama.cpp could not write the F16 copy of {src} (llama_model_quantize returned "
                               f"{rc}). Fix: set NEMORI_LOCAL_F16='[]' to serve the file as it is.")


#: RAM for the server's prompt-state cache (``local_prompt_cache``): llama-cpp-python evicts the oldest states
#: beyond it. A state of the 0.5B model holds ~12 KB of KV per token, so 512 MiB keeps some 20 prompts of 2k tokens
#: — more than the 8 stages of one window.
PROMPT_CACHE_BYTES = 512 << 20


def server_alias(model_path: str | os.PathLike[str]) -> str:
    """The model name a server of ``model_path`` answers to: ``local-<GGUF file stem, lower case>``, e.g.
    ``local-qwen2.5-coder-1.5b-instruct-q4_k_m``.

    DSPy's response cache keys a call by model name and prompt, not by ``api_base``; with one name for every
    local server, the 1.5B writer replayed the 0.5B's cached reply to the same prompt (and vice versa). A name
    per GGUF keeps each model's replies apart."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", Path(model_path).stem.lower()).strip("-")
    return f"local-{stem}" if stem else "local"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A ``llama_cpp.server`` subprocess serving one GGUF as the OpenAI model ``local``.

    Use as a context manager (or call :meth:`start` / :meth:`stop`); it is also stopped at
    interpreter exit, and on Linux it is SIGKILLed if the thread that started it dies (so start
    it from the main or a long-lived thread). litellm reaches it with ``model=self.model`` (``"openai/local"``),
    ``api_base=self.api_base`` and any non-empty api key.

    Args:
        model_path: the GGUF file (see :func:`resolve_gguf`).
        port: TCP port on 127.0.0.1; None picks a free one.
        n_ctx: context length in tokens.
        n_threads: CPU threads for generation.
        seed: llama.cpp sampling seed.
        flash_attn: flash attention (``--flash_attn``), on by default as ``NemoriSettings.flash_attn``; faster
            prefill on CPU, numerically not identical to off.
        prompt_cache: keep a RAM cache of evaluated prompt states (``--cache``, ``PROMPT_CACHE_BYTES``), so a
            prompt sharing its instruction prefix with any recent one, not only the previous, skips that prefill.
            Without it llama-cpp-python still reuses the prefix shared with the previous prompt (always on).
        startup_timeout_s: seconds to wait for ``GET /v1/models`` to answer 200.
        log_dir: folder for ``llama-server.log``; None = a fresh temp dir.

    Attributes:
        flags: the settings that shaped the run (model path/size, n_ctx, threads, seed, port...),
            for logging to MLflow.
        log_path: the server's combined stdout/stderr log.
        startup_s: seconds from spawn to ready (after :meth:`start`).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        port: int | None = None,
        n_ctx: int = 8192,
        n_threads: int = 2,
        seed: int = 0,
        flash_attn: bool = True,
        prompt_cache: bool = False,
        startup_timeout_s: float = 180.0,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.alias = server_alias(self.model_path)
        self.port = port or _free_port()
        self.n_ctx, self.n_threads, self.seed, self.flash_attn = n_ctx, n_threads, seed, flash_attn
        self.prompt_cache = prompt_cache
        self.startup_timeout_s = startup_timeout_s
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="nemori-llama-"))
        self.log_path = self._log_dir / "llama-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: Any = None
        self.startup_s: float | None = None
        self.flags: dict[str, Any] = {
            "gguf": str(self.model_path),
            "gguf_name": self.model_path.name,
            "gguf_bytes": self.model_path.stat().st_size if self.model_path.is_file() else None,
            "n_ctx": n_ctx,
            "n_threads": n_threads,
            "seed": seed,
            "flash_attn": flash_attn,
            "prompt_cache": prompt_cache,
            "port": self.port,
            "server": "llama_cpp.server",
            "llama_cpp_version": _llama_cpp_version(),
        }

    @classmethod
    def from_settings(cls, settings: NemoriSettings, **kw: Any) -> "LlamaServer":
        """Build (not start) a server from ``settings``: resolves the GGUF, takes n_ctx, n_threads, seed,
        flash_attn and port."""
        return cls(
            resolve_gguf(settings),
            port=settings.server_port,
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            seed=settings.seed,
            flash_attn=settings.flash_attn,
            prompt_cache=settings.local_prompt_cache,
            **kw,
        )

    # ------------------------------------------------------------------ properties
    @property
    def api_base(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        """litellm model string for this server: ``openai/local-<gguf stem>`` (see :func:`server_alias`)."""
        return f"openai/{self.alias}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The argv used to start the server."""
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path),
            "--model_alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            "--logits_all", "False",
            "--seed", str(self.seed),
            "--flash_attn", str(self.flash_attn),
            "--verbose", "False",
            *(["--cache", "True", "--cache_type", "ram", "--cache_size", str(PROMPT_CACHE_BYTES)]
              if self.prompt_cache else []),
        ]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LlamaServer":
        """Spawn the server and block until it answers ``GET /v1/models``.

        Raises:
            ModelServerError: the model file is missing, the process exited, or it was not
                ready within ``startup_timeout_s``; the message includes the log tail.
        """
        if self.running:
            return self
        if not self.model_path.is_file():
            raise ModelServerError(f"GGUF file not found: {self.model_path}. {_FIX_HINT}")
        import httpx

        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab")
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            self.command(), stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        atexit.register(self.stop)
        url = f"{self.api_base}/models"
        deadline = t0 + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                rc = self._proc.poll()
                if rc is not None:
                    tail = self.log_tail()
                    self._cleanup()
                    raise ModelServerError(
                        f"llama.cpp server exited with code {rc} before becoming ready "
                        f"(model {self.model_path}, port {self.port}). Log {self.log_path}:\n{tail}"
                    )
                try:
                    r = client.get(url)
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    self.stop()
                    raise ModelServerError(
                        f"llama.cpp server not ready after {self.startup_timeout_s:.0f}s "
                        f"(model {self.model_path}, port {self.port}). "
                        f"Fix: raise the startup timeout or use a smaller model. Log {self.log_path}:\n{tail}"
                    )
                time.sleep(0.25)
        self.startup_s = time.monotonic() - t0
        self.flags["startup_s"] = round(self.startup_s, 2)
        return self

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s). Idempotent.

        uvicorn waits for in-flight requests on SIGTERM, so a long generation is cut by the SIGKILL.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._cleanup()

    def _cleanup(self) -> None:
        self._proc = None
        if self._log_fh is not None:
            try:
                self._log_fh.close()
            finally:
                self._log_fh = None
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    def log_tail(self, n_lines: int = 40) -> str:
        """Last ``n_lines`` of the server log (empty if none)."""
        try:
            if self._log_fh is not None:
                self._log_fh.flush()
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n_lines:])

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LlamaServer({self.model_path.name!r}, port={self.port}, {state})"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGKILL the server when the spawning thread dies (atexit does not run on SIGKILL/SIGTERM)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _llama_cpp_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return None
