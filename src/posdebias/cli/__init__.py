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
    """A rich console that never truncates tables when output goes to a file or a pipe.

    Markup and emoji codes are off: what we print holds user text (labels, captions, paths,
    model ids) that must appear as written, so ``[red]`` or ``:smile:`` in a caption is shown
    literally (and ``[/x]`` cannot crash a command). Style with ``style=`` or ``Text`` instead.
    """
    console = Console(stderr=stderr, markup=False, emoji=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=160, markup=False, emoji=False)
    return console


#: An error message is cut to this many lines of at most this many characters.
MAX_MESSAGE_LINES = 60
MAX_LINE_CHARS = 1000


def printable(message: str) -> str:
    """``message`` safe for a terminal: control and other invisible characters (escape
    sequences, carriage returns, U+2028...) shown as escapes, lines and line count bounded."""
    lines = message.split("\n")
    shown = []
    for line in lines[:MAX_MESSAGE_LINES]:
        text = "".join(ch if ch == "\t" or ch.isprintable() else ascii(ch)[1:-1] for ch in line)
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f"... ({len(text) - MAX_LINE_CHARS} more characters)"
        shown.append(text)
    if len(lines) > MAX_MESSAGE_LINES:
        shown.append(f"... ({len(lines) - MAX_MESSAGE_LINES} more lines)")
    return "\n".join(shown)


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
        print(f"warning: {message}", file=file or sys.stderr)
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
