"""One collector for the problems of an input file: every reader checks each record on its own,
notes what is wrong (with the line or place), and reports them all in one error, so that a user
fixes a file in one pass instead of one error a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from posdebias._inputs import json_failure, jsonl_lines, loads_json
from posdebias.errors import BenchmarkError

_MAX_LISTED = 20


def problems_error(what: str, problems: Sequence[str], fix: str = "") -> BenchmarkError:
    """One error listing every problem (the first few dozen, then a count)."""
    shown = list(problems[:_MAX_LISTED])
    more = len(problems) - len(shown)
    lines = [f"{what}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"]
    lines += [f"  {problem}" for problem in shown]
    if more:
        lines.append(f"  ... and {more} more")
    if fix:
        lines.append(fix)
    return BenchmarkError("\n".join(lines))


class Problems:
    """The problems found in one input (``what`` names it in the error), in the order found."""

    def __init__(self, what: object) -> None:
        self.what = str(what)
        self._messages: list[str] = []

    def add(self, message: str, *, line: int | None = None) -> None:
        """Note one problem; ``line`` prefixes it with ``line N:``."""
        self._messages.append(message if line is None else f"line {line}: {message}")

    def extend(self, messages: Iterable[str], *, line: int | None = None) -> None:
        for message in messages:
            self.add(message, line=line)

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[str]:
        return iter(self._messages)

    def raise_any(self, fix: str = "") -> None:
        """Raise one :class:`BenchmarkError` listing every problem noted, if there is one."""
        if self._messages:
            raise problems_error(self.what, self._messages, fix)


def json_lines(text: str, problems: Problems) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSONL text; a line that is not JSON
    is noted as a problem and skipped."""
    for number, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            value = loads_json(line)
        except (RecursionError, ValueError) as exc:
            kind = "valid" if isinstance(exc, json.JSONDecodeError) else "usable"
            problems.add(f"not {kind} JSON ({json_failure(exc)})", line=number)
            continue
        yield number, value
