"""The ``posdebias`` command line: one module per subcommand, errors as messages, not tracebacks.

Each subcommand module exposes ``register(subparsers)`` (adds its parser and sets ``handler``);
only the module of the command being run is imported, so ``posdebias --help`` and a usage
error load neither torch nor the evaluation machinery.
Any :class:`PosdebiasError` becomes ``error: <message>`` on stderr and its exit code (2 for bad
input); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from rich.console import Console
from rich.table import Table

from posdebias._inputs import path_problem
from posdebias._text import SafeConsole, printable
from posdebias._threads import check_threads, torch_threads
from posdebias._version import __version__
from posdebias.errors import InputError, PosdebiasError, PosdebiasPluginWarning

#: Each subcommand (module ``posdebias.cli.NAME`` with ``-`` as ``_``, imported only when it
#: runs) and its line in ``posdebias --help``.
SUBCOMMANDS: dict[str, str] = {
    "build": "build a benchmark (random or CLIP hard negatives) from COCO, Flickr8k, JSONL, shapes",
    "calibrate": "fit calibrators and save their calibration states",
    "check": "verify an adapter on a model (spans, labels, scores, probe, batching, rotation)",
    "evaluate": "evaluate calibrators (no arguments: the bundled default run)",
    "lm-eval": "run lm-evaluation-harness with the model posdebias (lm-eval's own arguments)",
    "lm-eval-task": "write lm-eval tasks showing a benchmark in its N cyclic rotations",
    "lmms-eval-task": "write lmms-eval tasks showing a benchmark in its N cyclic rotations",
    "organism": "the bundled model organism (train it from a seed)",
    "plugins": "list adapters, calibrators, decoders, bundled models and their plugins",
    "rank": "rank the candidates of one query (images or texts) with a calibration",
    "report": "re-render table and figures of a run, or compare two runs (--compare)",
    "sweep": "run a study of the paper (n, calibration_size, top_k, tau, transfer)",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 2 in one clear line; an option is read only when written whole
    (``--calibration`` of a command without it was read as its ``--calibration-count``); an
    empty path (``--out "$UNSET"``) is refused, not read as the current folder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if action.type is not Path:
            return super()._get_value(action, arg_string)
        problem = path_problem(arg_string)
        if problem is not None:
            raise argparse.ArgumentError(action, problem)
        return Path(os.path.expanduser(arg_string))  # also where no shell expanded it ("~/x")

    def error(self, message: str) -> NoReturn:  # argparse's usage errors: exit 2, one clear line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


def make_console(stderr: bool = False, *, one_line_rows: bool = False) -> Console:
    """A console that never truncates tables when output goes to a file or a pipe and shows
    every string through the one output sanitiser (:mod:`posdebias._text`).

    Markup and emoji codes are off: what we print holds user text (labels, captions, paths,
    model ids) that must appear as written, so ``[red]`` or ``:smile:`` in a caption is shown
    literally (and ``[/x]`` cannot crash a command), and escape sequences in it are shown as
    escapes. Style with ``style=`` or :func:`posdebias._text.safe_text` instead.

    ``one_line_rows`` keeps every table row of a listing on one line in a file or a pipe
    (whatever its width), so ``grep`` finds a whole row.
    """
    console = SafeConsole(stderr=stderr)
    if not console.is_terminal:
        console = SafeConsole(stderr=stderr, width=10_000 if one_line_rows else 160)
    return console


def listing_table(title: str, columns: Sequence[str]) -> Table:
    """A table of plain columns under a left-justified title, as the commands list things."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def build_parser(args: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of ``posdebias``; of the subcommands only the one named in ``args`` (the first
    argument that is not an option) is fully built, the others are listed by name and help."""

    parser = _Parser(
        prog="posdebias",
        description="Measure and remove the position bias of language and multimodal models that "
        "choose one of N candidates (images, options, answers, passages).",
    )
    parser.add_argument("--version", action="version", version=f"posdebias {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    command = _command(args)
    for name, summary in SUBCOMMANDS.items():
        if name == command:
            module = importlib.import_module(f"posdebias.cli.{name.replace('-', '_')}")
            module.register(subparsers)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def _command(args: Sequence[str]) -> str | None:
    """The subcommand ``args`` run: the first argument that is not an option, unless the
    top-level help is asked for before it (then every subcommand is listed, none built)."""
    for arg in args:
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("-"):
            return arg
    return None


#: Arguments given as text that name files or folders (the others are typed ``Path``).
_PATH_TEXTS = ("model", "benchmark", "images")  # rank's candidates: in rank


def check_path_arguments(args: argparse.Namespace) -> None:
    """Refuse, before a command starts, a text argument naming no usable file or folder (typed
    ``Path`` arguments are checked as they are parsed), not mid-command."""
    for name in _PATH_TEXTS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str):
                check_path_text(item, f"--{name.replace('_', '-')}")


def check_path_text(path: str, what: str) -> None:
    """Refuse a path :func:`path_problem` refuses (an argument that is a path in some uses),
    naming the argument ``what``."""
    problem = path_problem(path)
    if problem is not None:
        raise InputError(f"{what}: {problem}")


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Plugin warnings as one line in the CLI's style; any other warning as Python shows it,
    its text sanitised (matplotlib's "Glyph 27 missing" quotes the ESC of a label)."""
    if issubclass(category, PosdebiasPluginWarning):
        print(f"warning: {printable(str(message))}", file=file or sys.stderr)
        return
    shown = printable(str(message))
    _python_show_warning(shown, category, printable(filename), lineno, file, line)


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
        parser = build_parser(args_list)
        args, extra = parser.parse_known_args(args_list)
        if getattr(args, "passed_on", None) is not None:  # a harness's own arguments
            args.passed_on = [*args.passed_on, *extra]
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            return 2
        check_path_arguments(args)
        if not hasattr(args, "threads"):  # a command that runs no model
            return int(args.handler(args) or 0)
        if args.threads is not None:
            check_threads(args.threads, "--threads")
        with torch_threads(args.threads, user=args.threads is not None):
            return int(args.handler(args) or 0)
    except PosdebiasError as exc:
        if debug:
            raise
        print(f"error: {printable(exc.message_for('cli'))}", file=sys.stderr)
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
