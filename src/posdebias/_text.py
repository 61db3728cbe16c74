"""The one output sanitiser: everything posdebias prints goes through :func:`printable`, and
everything it writes for people to read through :func:`file_text` or :func:`one_line`.

Strings from users and files (a config's ``out:``, a benchmark folder's name, an instance id, a
label, a plugin's message) reach tables, progress lines, paths and reports. A terminal obeys
escape sequences in them (``ESC]0;`` retitles the window, ``ESC[2J`` clears the screen), so every
control or invisible character is shown as its escape instead; rich markup is never interpreted
in them (consoles are made with ``markup=False``), so ``[red]`` is shown as written.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

#: An error message is cut to this many lines of at most this many characters.
MAX_MESSAGE_LINES = 60
MAX_LINE_CHARS = 1000


def _escaped(line: str) -> str:
    return "".join(ch if ch == "\t" or ch.isprintable() else ascii(ch)[1:-1] for ch in line)


def printable(message: str) -> str:
    """``message`` safe for a terminal: control and other invisible characters (escape
    sequences, carriage returns, U+2028...) shown as escapes, lines and line count bounded."""
    lines = str(message).split("\n")
    shown = []
    for line in lines[:MAX_MESSAGE_LINES]:
        text = _escaped(line)
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f"... ({len(text) - MAX_LINE_CHARS} more characters)"
        shown.append(text)
    if len(lines) > MAX_MESSAGE_LINES:
        shown.append(f"... ({len(lines) - MAX_MESSAGE_LINES} more lines)")
    return "\n".join(shown)


def file_text(text: str) -> str:
    """``text`` safe for a file people read (``report.md``, ``results.csv``, a figure's
    texts): the terminal's rule (every control or invisible character shown as its escape,
    ``ESC`` as ``\\x1b``), line breaks kept, nothing cut (a report is read in full)."""
    return "\n".join(_escaped(line) for line in str(text).split("\n"))


def one_line(value: Any) -> str:
    """``str(value)`` on one line for a table cell or a path: a newline shown as ``\\n`` too."""
    return _escaped(str(value))


class SafeConsole(Console):
    """A rich console that passes every string it renders through :func:`printable` (table
    cells, titles, ``print`` arguments), with markup and emoji codes off."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)


def safe_text(value: Any, style: str = "") -> Text:
    """A styled :class:`rich.text.Text` of ``value`` made safe (for our own styling: a PASS in
    green), which a console renders as it is."""
    return Text(one_line(value), style=style)
