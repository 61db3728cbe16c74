"""A progress bar with the running accuracy of every calibrator."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from posdebias._text import one_line


class RunProgress:
    """Context manager; ``update(record, running_accuracy)`` is the runner's on_record hook."""

    def __init__(self, console: Console, total: int) -> None:
        self._progress = Progress(
            TextColumn("evaluating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[accuracy]}", markup=False),  # labels are user text
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._progress.add_task("evaluate", total=total, accuracy="")

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._progress.__exit__(*exc_info)

    def update(self, record: object, accuracy: dict[str, float]) -> None:
        text = "  ".join(f"{one_line(label)} {value:.1f}%" for label, value in accuracy.items())
        self._progress.update(self._task, advance=1, accuracy=text)
