"""Option groups shared by several commands (decorators), and the flag types they use.

A group is applied as one decorator: ``@setting_options(EVAL_SETTINGS)`` adds one ``--flag`` per settings field,
whose help is the field's description, default and env var; ``settings_from_flags`` reads them back.
"""

from __future__ import annotations

import functools
import json
import logging
import typing
from pathlib import Path
from typing import Any, Callable

import click

__all__ = ["SETTING_FLAGS", "EVAL_SETTINGS", "OPTIMIZE_SETTINGS", "MEMORY_SETTINGS", "SLICE_HELP", "POSITIVE_INT",
           "SETTING_FLAGS_FILE", "live_setting_flags", "setting_help", "setting_type", "setting_options", "configure_logging", "verbose_option", "no_cache_option", "out_option", "data_option", "db_option",
           "program_and_tracking_options", "compose"]

#: CLI flag → settings field, for flags that map one-to-one (every eval and optimize).
SETTING_FLAGS = ("model", "api_base", "gguf", "models_dir", "local_model_size", "embedder", "embedder_path",
                 "judge_model", "window_size", "adapter", "mlflow_tracking_uri", "mlflow_experiment",
                 "distillation", "n_threads", "n_ctx")
#: the judged evals' settings flags (``--judge`` sets ``judge_prompt``).
EVAL_SETTINGS = (*SETTING_FLAGS, "judge_audit", "judge_prompt")
#: optimize's: the judge slot carries ``--reflection-model``.
OPTIMIZE_SETTINGS = tuple(n for n in SETTING_FLAGS if n != "judge_model")
#: ``serve`` and the memory commands' (``--db`` sets ``db_path``).
MEMORY_SETTINGS = ("model", "api_base", "embedder", "window_size", "store", "weaviate_url", "db_path")

#: ``--slice`` help, shared by eval locomo and optimize (the slices: ``eval.locomo.NAMED_SLICES``).
SLICE_HELP = ("a named LoCoMo slice: 'memory' = conv-49, all sessions (509 turns in 25 sessions, so top-10 must "
              "choose among >= 25 episodes; 156 scored questions in all four categories)")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class _PositiveInt(click.ParamType):
    """An integer ≥ 1 (0 would silently run nothing)."""

    name = "integer"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            number = int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number; give 1 or more", param, ctx)
        if number < 1:
            self.fail(f"{number} is less than 1; give 1 or more", param, ctx)
        return number


POSITIVE_INT = _PositiveInt()


def compose(*decorators: Decorator) -> Decorator:
    """One decorator applying ``decorators`` so that the options list in the order given."""
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


#: the settings flags' help and type, generated from ``NemoriSettings`` (``python -m nemori_dspy.apps.cli.options``)
#: so that ``--help`` needs no pydantic-settings import; ``tests/test_cli.py`` fails when it is stale.
SETTING_FLAGS_FILE = Path(__file__).with_name("setting_flags.json")


def live_setting_flags() -> dict[str, dict[str, Any]]:
    """``{field: {"help": str, "type": "int" | "float" | "bool" | "str" | [choices...]}}`` for every
    ``NemoriSettings`` field, computed from the model (imports pydantic-settings; what ``setting_flags.json`` holds)."""
    from nemori_dspy.config import NemoriSettings

    return {name: {"help": _help_of(name, field), "type": _type_of(field.annotation)}
            for name, field in NemoriSettings.model_fields.items()}


def _help_of(name: str, field: Any) -> str:
    choices = _choices(field.annotation)
    allowed = f"one of {', '.join(choices)}; " if choices else ""
    return f"{field.description or name} ({allowed}default: {field.default}; env NEMORI_{name.upper()})"


def _choices(annotation: Any) -> list[str] | None:
    """The values of a ``Literal`` (optional or not) annotation as strings, else None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:  # Optional[Literal[...]]
        return [str(a) for a in typing.get_args(args[0])]
    return None


def _type_of(annotation: Any) -> str | list[str]:
    choices = _choices(annotation)
    if choices is not None:
        return choices
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1:  # Optional[X]
        annotation = args[0]
    return {int: "int", float: "float", bool: "bool"}.get(annotation, "str")


@functools.cache
def _setting_flags() -> dict[str, dict[str, Any]]:
    if not SETTING_FLAGS_FILE.exists():  # being regenerated: the model itself (slower, same answer)
        return live_setting_flags()
    return json.loads(SETTING_FLAGS_FILE.read_text(encoding="utf-8"))


def setting_help(name: str) -> str:
    """``--help`` text of a settings flag: the field's description, default and env var (from ``setting_flags.json``).

    Raises:
        KeyError: ``name`` is no settings field.
    """
    return _setting_flags()[name]["help"]


def setting_type(name: str) -> click.ParamType:
    """The click type of a settings flag, from the field's annotation: a ``Literal`` → ``click.Choice``, ``int`` /
    ``float`` / ``bool`` (optional or not) → ``click.INT`` / ``FLOAT`` / ``BOOL``, anything else ``click.STRING`` (the
    settings object validates it).

    Raises:
        KeyError: ``name`` is no settings field.
    """
    kind = _setting_flags()[name]["type"]
    if isinstance(kind, list):
        return click.Choice(kind)
    return {"int": click.INT, "float": click.FLOAT, "bool": click.BOOL}.get(kind, click.STRING)


def setting_options(names: tuple[str, ...], short_help: bool = False) -> Decorator:
    """One ``--name`` option per settings field of ``names`` (default None: the settings decide). ``judge_prompt``
    is ``--judge``, ``db_path`` is left to ``db_option``; ``short_help`` says only "override setting X"."""
    def help_of(name: str) -> str:
        return f"override setting {name} (env NEMORI_{name.upper()})" if short_help else setting_help(name)

    options = []
    for name in names:
        if name == "db_path":
            continue
        if name == "judge_prompt":
            options.append(click.option("--judge", "judge_prompt", type=click.Choice(["generous", "strict", "both"]),
                                        default=None, help=setting_help("judge_prompt")))
            continue
        options.append(click.option("--" + name.replace("_", "-"), name, default=None, type=setting_type(name),
                                    help=help_of(name)))
    return compose(*options)


def configure_logging(verbose: bool) -> None:
    """Root logging at INFO (``verbose``) or WARNING, with time, level and logger name on each line."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _log_level(ctx: click.Context, param: click.Parameter, verbose: bool) -> bool:
    configure_logging(verbose)
    return verbose


def verbose_option(help: str = "log INFO (resolved config, repairs, retries)") -> Decorator:
    """``-v/--verbose``: the root logger at INFO for this command."""
    return click.option("-v", "--verbose", is_flag=True, callback=_log_level, help=help)


def no_cache_option() -> Decorator:
    """``--no-cache``: DSPy's response cache off (``cache=False``)."""
    return click.option("--no-cache", is_flag=True, help="disable DSPy's response cache")


def out_option(help: str) -> Decorator:
    """``--out``: the run folder."""
    return click.option("--out", default=None, help=help)


def data_option(help: str, required: bool = False) -> Decorator:
    """``--data``: the benchmark file."""
    if required:  # no default at all: click treats an explicit None default as given
        return click.option("--data", required=True, help=help)
    return click.option("--data", default=None, help=help)


def db_option(help: str, dest: str = "db") -> Decorator:
    """``--db``: a SQLite store file (``dest``: the flag's name in the command, ``db`` or ``db_path``)."""
    return click.option("--db", dest, default=None, help=help)


def program_and_tracking_options() -> Decorator:
    """Flags every eval shares: the program to run, model registration, judge and MLflow off switches."""
    return compose(
        click.option("--program", multiple=True,
                     help="a saved pipeline state to run (e.g. optimized prompts/demos): a program.json, "
                          "runs:/<run_id>/program or models:/<name>/<version> (an eval's logged model); or a stage "
                          "prompt from the MLflow prompt registry, prompts:/<name>@<alias> (e.g. "
                          "prompts:/nemori-dspy-answer@tuned), laid over the program or the default prompts; "
                          "repeat to combine one program with stage prompts"),
        click.option("--register-model", default=None,
                     help="also register the program that ran as an MLflow model under this name"),
        click.option("--no-judge", is_flag=True, help="skip the LLM judge"),
        click.option("--no-mlflow", is_flag=True, help="do not log to MLflow"))


if __name__ == "__main__":  # regenerate setting_flags.json after a settings field changes
    SETTING_FLAGS_FILE.write_text(json.dumps(live_setting_flags(), indent=1, ensure_ascii=False) + "\n",
                                  encoding="utf-8")
    print(f"wrote {SETTING_FLAGS_FILE}")
