"""Option groups shared by several commands (decorators), and the flag types they use.

A group is applied as one decorator: ``@setting_options(EVAL_SETTINGS)`` adds one ``--flag`` per settings field,
whose help is the field's description, default and env var; ``settings_from_flags`` reads them back.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import click

__all__ = ["SETTING_FLAGS", "EVAL_SETTINGS", "OPTIMIZE_SETTINGS", "MEMORY_SETTINGS", "SLICE_HELP", "POSITIVE_INT",
           "setting_help", "setting_type", "setting_options", "configure_logging", "verbose_option", "no_cache_option", "out_option", "data_option", "db_option",
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


def setting_help(name: str) -> str:
    """``--help`` text of a settings flag: the field's description, default and env var."""
    from nemori_dspy.config import NemoriSettings

    field = NemoriSettings.model_fields[name]
    choices = getattr(field.annotation, "__args__", None) if "Literal" in str(field.annotation) else None
    allowed = f"one of {', '.join(map(str, choices))}; " if choices else ""
    return f"{field.description or name} ({allowed}default: {field.default}; env NEMORI_{name.upper()})"


def setting_type(name: str) -> click.ParamType:
    """The click type of a settings flag, from the field's annotation: a ``Literal`` → ``click.Choice``, ``int`` /
    ``float`` / ``bool`` (optional or not) → ``click.INT`` / ``FLOAT`` / ``BOOL``, anything else ``click.STRING`` (the
    settings object validates it)."""
    import typing

    from nemori_dspy.config import NemoriSettings

    annotation = NemoriSettings.model_fields[name].annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)])
    if len(args) == 1:  # Optional[X]
        annotation = args[0]
        if typing.get_origin(annotation) is typing.Literal:
            return click.Choice([str(a) for a in typing.get_args(annotation)])
    return {int: click.INT, float: click.FLOAT, bool: click.BOOL}.get(annotation, click.STRING)


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
