"""The ``posdebias`` command line: one module per subcommand, errors as messages, not tracebacks.

Each subcommand module exposes ``register(subparsers)`` (adds its parser and sets ``handler``).
Any :class:`PosdebiasError` becomes ``error: <message>`` on stderr and its exit code (2 for bad
input); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn, TextIO

from rich.console import Console

from posdebias._text import SafeConsole, printable
from posdebias._version import __version__
from posdebias.errors import InputError, PosdebiasError, PosdebiasPluginWarning

SUBCOMMANDS = (
    "build",
    "calibrate",
    "check",
    "evaluate",
    "lmms_eval_task",
    "organism",
    "plugins",
    "rank",
    "report",
    "sweep",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's usage errors: exit 2, one clear line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


def make_console(stderr: bool = False) -> Console:
    """A console that never truncates tables when output goes to a file or a pipe and shows
    every string through the one output sanitiser (:mod:`posdebias._text`).

    Markup and emoji codes are off: what we print holds user text (labels, captions, paths,
    model ids) that must appear as written, so ``[red]`` or ``:smile:`` in a caption is shown
    literally (and ``[/x]`` cannot crash a command), and escape sequences in it are shown as
    escapes. Style with ``style=`` or :func:`posdebias._text.safe_text` instead.
    """
    console = SafeConsole(stderr=stderr)
    if not console.is_terminal:
        console = SafeConsole(stderr=stderr, width=160)
    return console


def build_parser() -> argparse.ArgumentParser:

    parser = _Parser(
        prog="posdebias",
        description="Measure and remove position bias of multimodal LLMs in multi-image retrieval.",
    )
    parser.add_argument("--version", action="version", version=f"posdebias {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"posdebias.cli.{name}").register(subparsers)
    return parser


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Plugin warnings as one line in the CLI's style; any other warning as Python shows it."""
    if issubclass(category, PosdebiasPluginWarning):
        print(f"warning: {printable(str(message))}", file=file or sys.stderr)
        return
    _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        if any("\x00" in arg for arg in args_list):  # only possible in-process, never from a shell
            raise InputError("an argument contains a NUL character; no path or name can")
        parser = build_parser()
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args.handler(args) or 0)
    except PosdebiasError as exc:
        if debug:
            raise
        print(f"error: {printable(exc.cli_message())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not a user error: say so instead of a bare traceback
        if debug:
            raise
        print(
            f"internal error: {type(exc).__name__}: {printable(str(exc))}\nrun again with "
            "--debug for the traceback and please report it",
            file=sys.stderr,
        )
        return 1
