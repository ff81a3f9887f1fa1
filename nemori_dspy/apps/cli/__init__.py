"""The ``nemori-dspy`` command line: one click group with a function per command.

``eval locomo|longmemeval`` and ``report`` (``evaluate.py``), ``optimize`` (``optimize.py``), ``serve
http|mcp|token`` (``serve.py``) and the memory commands ``add``, ``search``, ``answer``, ``list``, ``delete``,
``forget``, ``export``, ``import``, ``flush``, ``status``, ``history``, ``update`` (``memory.py``); ``--version``
prints the installed version. Options override ``NemoriSettings`` (which also reads
``NEMORI_*`` env vars); every command builds its run through ``nemori_dspy.apps.context``.
"""

from __future__ import annotations

import signal
import sys
from typing import Sequence

import click

from nemori_dspy.apps.cli.evaluate import eval_group, report
from nemori_dspy.apps.cli.memory import MEMORY_COMMANDS
from nemori_dspy.apps.cli.optimize import optimize
from nemori_dspy.apps.cli.serve import serve

__all__ = ["cli", "main"]


class _InOrder(click.Group):
    """A group whose ``--help`` lists the commands in the order they were added (benchmarks first)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group("nemori-dspy", cls=_InOrder, help="Nemori long-term memory as a DSPy pipeline",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=None, package_name="nemori-dspy", prog_name="nemori-dspy",
                      message="%(prog)s %(version)s")
def cli() -> None:
    """The root group; its commands are added below."""


for _command in (eval_group, optimize, report, serve, *MEMORY_COMMANDS):
    cli.add_command(_command)


def _command_words(argv: Sequence[str] | None) -> list[str]:
    """The command (and subcommand) words of ``argv``, for an error message: ``["eval", "locomo"]``."""
    words = []
    for a in list(sys.argv[1:] if argv is None else argv):
        if a.startswith("-") or len(words) == 2:
            break
        words.append(a)
    return words


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nemori-dspy`` script: runs the command ``argv`` names (default ``sys.argv[1:]``) and
    returns its exit code; a ``NemoriError`` prints one line (``error: ...``) and returns 2.

    Raises:
        SystemExit: 2 on a usage error (unknown command or flag, bad value; the message goes to stderr), 0 after
            ``--help``, 143 / 129 on SIGTERM / SIGHUP.
        ModuleNotFoundError: a module no extra provides is missing (one an extra provides, e.g. ``nltk`` of
            ``eval``, prints ``error: ... Fix: pip install "nemori-dspy[eval]"`` and returns 2).
        KeyboardInterrupt: Ctrl-C, after the open runs and model servers have been closed.
    """
    from nemori_dspy.errors import NemoriError
    from nemori_dspy.extras import COMMAND_EXTRA, extra_error

    # SIGTERM unwinds like Ctrl-C, so the embedded model server and open runs are closed cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if hasattr(signal, "SIGHUP"):  # a closed terminal: the same clean end (an eval's MLflow run ends KILLED)
        signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    try:
        code = cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="nemori-dspy",
                        standalone_mode=False)
    except NemoriError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a command of an extra the core install lacks (eval, optimize, serve...)
        words = _command_words(argv)
        err = extra_error(exc, " ".join(["nemori-dspy", *words]), COMMAND_EXTRA.get(words[0]) if words else None)
        if err is None:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except click.exceptions.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise exc.__context__ from None
        raise SystemExit(1) from None
    return code if isinstance(code, int) else 0
