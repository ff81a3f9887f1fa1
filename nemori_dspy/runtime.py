"""Entry-point wiring: ``NemoriSettings`` → LMs (litellm via ``dspy.LM``) → ``dspy.configure``.

Config flows one way: build a ``Runtime`` once at the entry point; modules read the configured LM.
``model="local"`` starts the embedded llama.cpp server and points an ``openai/local-<gguf stem>`` LM at it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import dspy

from .adapters import make_adapter
from .config import MEMORY_WRITING_STAGES, NemoriSettings
from .usage import UsageTrackingMixin

__all__ = ["TrackedLM", "Runtime", "build_runtime", "check_credentials", "make_lm"]

log = logging.getLogger(__name__)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class TrackedLM(UsageTrackingMixin, dspy.LM):
    """``dspy.LM`` whose calls are charged per stage to the active ledgers (``nemori_dspy.usage``)."""


def make_lm(settings: NemoriSettings, model: str, api_base: str | None = None, api_key: str | None = None,
            max_tokens: int | None = None) -> TrackedLM:
    """One litellm-backed LM. ``engine="litellm"`` is forced: dspy 3.4's default engine sends
    ``max_completion_tokens``, which llama.cpp ignores (a run-away generation)."""
    kwargs: dict[str, Any] = {}
    if api_base:
        kwargs["api_base"] = api_base
    key = api_key or (settings.api_key.get_secret_value() if settings.api_key else None)
    if key:
        kwargs["api_key"] = key
    local = api_key == "sk-local"
    # A local llama.cpp server cannot cancel a request: a client-side timeout + retry would queue a second
    # copy behind the first. Local calls therefore wait longer and are not re-sent on timeout.
    return TrackedLM(model, engine="litellm", temperature=settings.temperature, seed=settings.seed,
                     max_tokens=max_tokens or settings.max_tokens, cache=settings.cache,
                     num_retries=0 if local else settings.num_retries,
                     timeout=max(settings.timeout_s, 3600.0) if local else settings.timeout_s, **kwargs)


@dataclass
class Runtime:
    """Live LMs built from settings, plus the embedded server when ``model == "local"``."""

    settings: NemoriSettings
    lm: dspy.BaseLM
    judge_lm: dspy.BaseLM
    stage_lms: dict[str, dspy.BaseLM] = field(default_factory=dict)
    server: Any = None
    model_label: str = ""
    judge_server: Any = None
    judge_label: str = ""
    stage_servers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Stop the embedded servers, if any."""
        for name in ("server", "judge_server"):
            srv = getattr(self, name)
            if srv is not None:
                srv.stop()
                setattr(self, name, None)
        while self.stage_servers:
            self.stage_servers.pop().stop()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_local(settings: NemoriSettings) -> Any:
    from .local_server import LlamaServer

    return LlamaServer.from_settings(settings).start()


def _hosted_models(settings: NemoriSettings) -> list[tuple[str, str]]:
    """(where it is set, litellm model string) for every model this run calls through a provider."""
    models = [] if settings.model == "local" else [("model / NEMORI_MODEL", settings.model)]
    models += [(f"stage_lms.{name}", o.model) for name, o in settings.stage_lms.items()
               if o.model and not o.model.startswith("local:")]
    if settings.judge_model and not settings.judge_model.startswith("local:"):
        models.append(("judge_model / NEMORI_JUDGE_MODEL", settings.judge_model))
    return models


def check_credentials(settings: NemoriSettings) -> None:
    """Fail in milliseconds, before any server starts, when a hosted model's API key is not set.

    Uses ``litellm.validate_environment``. Skipped when ``api_key`` / ``NEMORI_API_KEY`` is given or
    ``api_base`` points at a server (vLLM, Ollama, ...: they may need no key); provider base-URL
    variables (e.g. ``OLLAMA_API_BASE``, which has a default) are not required.

    Raises:
        ConfigError: names the model, where it was set, the missing variable(s) and the fix.
    """
    if settings.api_key or settings.api_base:
        return
    import litellm

    from .errors import ConfigError

    for where, model in _hosted_models(settings):
        missing = [k for k in litellm.validate_environment(model=model).get("missing_keys", [])
                   if not k.endswith("_API_BASE")]
        if missing:
            raise ConfigError(f"{where} = {model!r} needs {' and '.join(missing)}, which is not set. Fix: export "
                              f"{missing[0]}=... (or NEMORI_API_KEY), point --api-base at a server that needs no "
                              "key, or use --model local for the embedded model.")


class _LocalPool:
    """The embedded llama.cpp servers of one run, one per model size (``local:0.5b`` / ``local:1.5b``), started on
    first use: the judge and any ``stage_lms`` entry naming ``local:<size>`` share one server per size."""

    def __init__(self, settings: NemoriSettings) -> None:
        self.settings, self.servers = settings, {}

    def server(self, size: str) -> Any:
        """The running server of ``size`` ("0.5b" | "1.5b"), started now if it is not yet."""
        if size not in self.servers:
            main = size == self.settings.local_model_size and self.settings.model == "local"
            self.servers[size] = _start_local(self.settings if main else self.settings.model_copy(
                update={"local_model_size": size, "gguf": None, "server_port": None}))
        return self.servers[size]

    def lm(self, size: str) -> TrackedLM:
        srv = self.server(size)
        return make_lm(self.settings, srv.model, srv.api_base, "sk-local")


def _stage_lm(settings: NemoriSettings, pool: _LocalPool, model: str) -> TrackedLM:
    """A ``stage_lms`` entry's LM: ``local:<size>`` → that size's embedded server, else a litellm model string."""
    if model.startswith("local:"):
        return pool.lm(model[6:])
    return make_lm(settings, model, settings.api_base)


def build_runtime(settings: NemoriSettings, configure: bool = True) -> Runtime:
    """Build LMs (starting the local servers asked for) and, by default, ``dspy.configure`` them.

    ``model="local"`` starts the embedded server of ``local_model_size``; ``judge_model`` and ``stage_lms`` models
    ``local:<size>`` use the server of that size, one per size (e.g. the 1.5B judge also narrates with
    ``stage_lms={"narrate": {"model": "local:1.5b"}}``). With ``model="local"``, ``local_memory_model`` (default 1.5B)
    serves the ``MEMORY_WRITING_STAGES`` that ``stage_lms`` does not name.

    Raises:
        ConfigError: the local GGUF cannot be found or fetched, or a hosted model's API key is missing
            (see ``check_credentials``; checked before anything starts).
        ModelServerError: a local server did not start.
    """
    check_credentials(settings)
    pool = _LocalPool(settings)
    model, api_base, api_key, server, label = settings.model, settings.api_base, None, None, settings.model
    if model == "local":
        server = pool.server(settings.local_model_size)
        model, api_base, api_key, label = server.model, server.api_base, "sk-local", f"local:{server.model_path.name}"
    lm = make_lm(settings, model, api_base, api_key)
    judge, judge_server = lm, None
    same_local = (server is not None and not settings.gguf
                  and settings.judge_model == f"local:{settings.local_model_size}")
    if same_local:
        pass  # the judge is the answer model: one server serves both
    elif settings.judge_model and settings.judge_model.startswith("local:"):
        judge = pool.lm(settings.judge_model[6:])
        judge_server = pool.server(settings.judge_model[6:])
    elif settings.judge_model:
        judge = make_lm(settings, settings.judge_model, settings.api_base)
    stage_lms = {name: _stage_lm(settings, pool, o.model) for name, o in settings.stage_lms.items() if o.model}
    size = settings.local_memory_model
    if settings.model == "local" and not settings.gguf and size and size != settings.local_model_size:
        stage_lms.update({name: pool.lm(size) for name in MEMORY_WRITING_STAGES if name not in stage_lms})
    others = [s for s in pool.servers.values() if s is not server and s is not judge_server]
    judge_label = (f"local:{judge_server.model_path.name}" if judge_server
                   else label if same_local else settings.judge_model or label)
    rt = Runtime(settings=settings, lm=lm, judge_lm=judge, stage_lms=stage_lms, server=server, model_label=label,
                 judge_server=judge_server, judge_label=judge_label, stage_servers=others)
    if configure:
        dspy.configure(lm=lm, adapter=make_adapter(settings.adapter))
    return rt
