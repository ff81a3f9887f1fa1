"""One way to start a run: settings from the command line's flags, then the runtime (LMs, the embedded model
server), the memory and the saved program every command runs with.

``eval``, ``optimize``, ``serve`` and the memory commands all build through here, so a ``--program``
reference, a store and a pipeline mean the same thing under every command. Heavy libraries (dspy, mlflow,
the embedders) are imported inside the functions: ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.memory import Memory
    from nemori_dspy.runtime import Runtime

__all__ = ["LOCOMO_URL", "RunContext", "settings_from_flags", "resolve_dataset", "run_dir", "split_ids",
           "build_memory", "memory_provider", "locomo_judges", "load_program_ref", "stage_models"]

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376/data/locomo10.json"


def settings_from_flags(flags: Mapping[str, Any], fields: Iterable[str]) -> "NemoriSettings":
    """``NemoriSettings`` from the environment / ``.env`` with the command line's overrides: each name of
    ``fields`` whose flag in ``flags`` is not None, and ``cache=False`` when ``flags["no_cache"]`` is set.

    Args:
        flags: the parsed flags of one command (flag destination → value; None = not given).
        fields: the settings fields this command exposes as flags (``--model`` → ``model``, ...).
    Raises:
        ConfigError: a value is invalid (``config.load_settings`` names the field, its source and a fix).
    """
    from nemori_dspy.config import load_settings

    overrides = {k: flags[k] for k in fields if flags.get(k) is not None}
    if flags.get("no_cache"):
        overrides["cache"] = False
    return load_settings(**overrides)


def split_ids(text: str | None) -> list[str] | None:
    """``"conv-26, conv-30"`` → ``["conv-26", "conv-30"]``; None for None or an empty string."""
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def resolve_dataset(path: str | None, settings: "NemoriSettings | None" = None) -> Path:
    """--data, else ``settings.locomo_path`` ($NEMORI_LOCOMO_PATH or .env), else the upstream
    locomo10.json downloaded once into ``settings.cache_dir``.

    The dataset is CC BY-NC 4.0: it is read from a path or fetched at run time, never shipped.

    Raises:
        DatasetError: the download failed (no path given and no network).
    """
    from nemori_dspy.config import NemoriSettings
    from nemori_dspy.errors import DatasetError

    settings = settings or NemoriSettings()
    chosen = path or settings.locomo_path
    if chosen:
        return Path(chosen)
    target = Path(settings.cache_dir) / "locomo10.json"
    if not target.exists():
        import httpx

        try:
            r = httpx.get(LOCOMO_URL, timeout=60, follow_redirects=True)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise DatasetError(f"could not download LoCoMo from {LOCOMO_URL}: {exc}. Fix: pass --data "
                               "path/to/locomo10.json or set NEMORI_LOCOMO_PATH.") from exc
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(r.content)
    return target


def run_dir(out: str | None, kind: str = "locomo", resume: bool = False) -> Path:
    """The run folder: ``out`` if given; with ``resume`` the newest ``runs/<kind>-*`` that got as far as
    answering (a failed start leaves an empty folder); else a new ``runs/<kind>-<time>``."""
    if out:
        return Path(out)
    if resume:
        runs = sorted(p for p in Path("runs").glob(f"{kind}-*") if (p / "results.jsonl").exists())
        if runs:
            return runs[-1]
    return Path(f"runs/{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def load_program_ref(ref: str | Sequence[str] | None, settings: "NemoriSettings") -> dict[str, Any] | None:
    """The saved pipeline state ``--program`` names; None without a ref.

    ``ref``: one reference or several. A program: a ``program.json`` path, ``runs:/<run_id>/program`` or
    ``models:/<name>/<version>`` (at most one; a model URI resolves in the settings' MLflow store). A stage prompt
    from the registry: ``prompts:/<name>@<alias>`` or ``prompts:/<name>/<version>`` (e.g.
    ``prompts:/nemori-dspy-answer@tuned``), laid over that program, or over the code's default prompts when no
    program is named (``eval.model.overlay_stage_prompt``).

    Raises:
        ConfigError: a file, model or prompt cannot be read, or two programs are named.
    """
    refs = [ref] if isinstance(ref, str) else [r for r in (ref or ()) if r]
    if not refs:
        return None
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.eval.model import ProgramModel, is_model_uri, is_prompt_uri, load_program, overlay_stage_prompt, \
        program_state

    programs, prompts = [r for r in refs if not is_prompt_uri(r)], [r for r in refs if is_prompt_uri(r)]
    if len(programs) > 1:
        raise ConfigError(f"--program names {len(programs)} programs ({', '.join(programs)}). Fix: name one "
                          "program.json / runs:/ / models:/ reference; add stage prompts with prompts:/<name>@<alias>.")
    uri = None
    if any(is_model_uri(r) or is_prompt_uri(r) for r in refs):
        from nemori_dspy.eval.tracking import tracking_uri

        uri = tracking_uri(settings)
    state = load_program(programs[0], uri) if programs else None
    if prompts:
        from nemori_dspy.extras import require

        mlflow = require("mlflow", "--program prompts:/...")

        from nemori_dspy.eval.tracking import load_stage_prompt

        mlflow.set_tracking_uri(uri)
        state = state if state is not None else program_state(ProgramModel(settings))
        for p in prompts:
            stage, text, _ = load_stage_prompt(p)
            state = overlay_stage_prompt(state, stage, text)
    return state


def build_memory(settings: "NemoriSettings", store: Any, embedder: Any, stage_lms: dict | None = None,
                 program: dict[str, Any] | None = None) -> "Memory":
    """A ``Memory`` over ``store`` whose pipeline runs its stages on ``stage_lms`` (stage → LM; others on the
    configured LM) with ``program`` (a saved pipeline state) applied."""
    from nemori_dspy.eval.model import apply_program
    from nemori_dspy.memory import Memory
    from nemori_dspy.modules.pipeline import NemoriPipeline, stage_factory
    from nemori_dspy.modules.resources import Resources

    pipeline = NemoriPipeline(Resources(store, embedder, settings), stage_factory(settings, stage_lms))
    if program:
        apply_program(pipeline, program)
    return Memory(store, embedder, settings, pipeline=pipeline)


def memory_provider(settings: "NemoriSettings", rt: Any, data_sha: str, program: dict[str, Any] | None,
                    sessions: str | None = None, db: str | None = None) -> tuple[Any, str]:
    """(memory provider, embedder name) for the evals and ``optimize``: with ``db`` one shared store (stage
    records beside it, ``<db>.stages.jsonl``), else stores reused by construction key (settings, model,
    program, dataset sha256, LoCoMo slice label ``sessions``) under ``settings.cache_dir``.

    Raises:
        ConfigError: the store or embedder the settings name cannot be opened.
    """
    from nemori_dspy.embedders import resolve_embedder
    from nemori_dspy.eval.cache import CachedMemories, construction_key
    from nemori_dspy.eval.runner import SharedMemory
    from nemori_dspy.store import open_store

    embedder = resolve_embedder(settings)

    def make_memory(s: Any, path: Path) -> Any:
        return build_memory(s, open_store(s, path), embedder, rt.stage_lms, program)

    if db:
        return SharedMemory(make_memory(settings, Path(db)), Path(db + ".stages.jsonl")), embedder.name

    def key_of(s: Any) -> str:
        return construction_key(s, rt.model_label, embedder.name, data_sha, program, sessions)

    return CachedMemories(settings, make_memory, key_of, settings.cache_dir), embedder.name


def locomo_judges(settings: "NemoriSettings", rt: Any, audit: list[Any]) -> Any:
    """The LoCoMo judge panel (``eval.judge.JudgePanel``) on the runtime's judge LM: the prompt(s)
    ``settings.judge_prompt`` names (``judge``, ``judge_strict``), with its calibration set ``audit``."""
    from nemori_dspy.eval.judge import JUDGE_METRICS, JudgePanel, LLMJudge

    return JudgePanel({name: LLMJudge(rt.judge_lm, max_tokens=settings.stage_max_tokens("judge"),
                                      parse_retries=settings.parse_retries, model_label=rt.judge_label,
                                      strict=name == "judge_strict")
                       for name in JUDGE_METRICS[settings.judge_prompt]}, audit)


class RunContext:
    """What one command runs with, built from its ``settings``: ``runtime()`` (LMs and model servers, a
    context manager), ``program(ref)`` (a saved pipeline state), ``memory(...)`` (one store) and
    ``memory_provider(...)`` (the evals' stores per construction key).

    Args:
        settings: the command's settings (``settings_from_flags``).
    """

    def __init__(self, settings: "NemoriSettings") -> None:
        self.settings = settings

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], fields: Iterable[str]) -> "RunContext":
        """``RunContext(settings_from_flags(flags, fields))``. Raises ``ConfigError`` on an invalid value."""
        return cls(settings_from_flags(flags, fields))

    def runtime(self, settings: "NemoriSettings | None" = None) -> "AbstractContextManager[Runtime]":
        """``runtime.build_runtime`` on ``settings`` (default: this context's): configures dspy, starts the
        embedded model server(s) the settings name; use as ``with ctx.runtime() as rt``."""
        from nemori_dspy import runtime

        return runtime.build_runtime(settings or self.settings)

    def program(self, ref: str | Sequence[str] | None) -> dict[str, Any] | None:
        """``load_program_ref(ref, self.settings)``: a model URI resolves in this run's MLflow store."""
        return load_program_ref(ref, self.settings)

    def memory(self, stage_lms: dict | None = None, program: dict[str, Any] | None = None) -> "Memory":
        """A ``Memory`` on the settings' store (``db_path`` or Weaviate) and embedder (``build_memory``).

        Raises:
            ConfigError: the store or embedder cannot be opened.
        """
        from nemori_dspy.embedders import resolve_embedder
        from nemori_dspy.store import open_store

        return build_memory(self.settings, open_store(self.settings), resolve_embedder(self.settings), stage_lms,
                            program)

    def memory_provider(self, rt: Any, data_sha: str, program: dict[str, Any] | None, sessions: str | None = None,
                        db: str | None = None) -> tuple[Any, str]:
        """``memory_provider(self.settings, rt, ...)``: the evals' and optimize's stores."""
        return memory_provider(self.settings, rt, data_sha, program, sessions, db)


def stage_models(rt: Any) -> str:
    """Which stages run on a model other than the runtime's default, for a run's first line: ``"memory stages (all
    but partition) on local:1.5b"`` (``local_memory_model``) or ``"narrate, distill on <litellm model>"``
    (``stage_lms``); ``rt`` is a started runtime with ``stage_lms`` and ``settings``. ``""`` when none does."""
    if not rt.stage_lms:
        return ""
    from nemori_dspy.config import MEMORY_WRITING_STAGES

    size = rt.settings.local_memory_model
    local = bool(size) and rt.settings.model == "local"
    label = f"local:{size}" if local else ", ".join(sorted({getattr(lm, "model", "?") for lm in rt.stage_lms.values()}))
    stages = ("memory stages (all but partition)" if set(rt.stage_lms) == set(MEMORY_WRITING_STAGES)
              else ", ".join(sorted(rt.stage_lms)))
    return f"{stages} on {label}"
