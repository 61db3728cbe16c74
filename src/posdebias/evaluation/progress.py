"""Progress of a run where its user looks: a bar in a terminal, lines in a log.

In a terminal, a rich bar with the running accuracy of every calibrator (it disappears when the
run ends). When the output goes to a file or a pipe (a batch job, ``nohup``, CI) a bar cannot be
drawn, and a run used to print nothing for minutes; there a line goes to stderr at a steady
pace (every :data:`INTERVAL` seconds, ``POSDEBIAS_PROGRESS_SECONDS`` to change it): instances
done, the rate, and the time left.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from posdebias._text import one_line

#: Seconds between two progress lines outside a terminal.
INTERVAL = 30.0

#: The environment variable that sets the seconds between two progress lines (0.1 to 86,400).
INTERVAL_VARIABLE = "POSDEBIAS_PROGRESS_SECONDS"


def line_interval() -> float:
    """The seconds between progress lines: ``POSDEBIAS_PROGRESS_SECONDS`` when it holds a
    number from 0.1 to 86,400, else :data:`INTERVAL`."""
    try:
        value = float(os.environ.get(INTERVAL_VARIABLE, ""))
    except ValueError:
        return INTERVAL
    return value if 0.1 <= value <= 86_400 else INTERVAL


def duration(seconds: float) -> str:
    """``42s``, ``5m 08s``, ``2h 03m``: a time span as people read it."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


class ProgressLines:
    """A line to ``stream`` every ``interval`` seconds from a timer thread (so a phase without
    records, like loading or calibrating, still shows the run is alive), and a last one at the
    end of a run that printed any.

    The rate counts from the first instance done (loading and calibration excluded), so the
    time left is that of the instances still to do at the rate they are being done.
    """

    def __init__(
        self,
        total: int | None,
        *,
        stream: TextIO | None = None,
        interval: float | None = None,
        what: str = "evaluating",
    ) -> None:
        self.total = total
        self.stream = stream
        self.interval = line_interval() if interval is None else interval
        self.what = what
        self.done = 0
        self.printed = 0
        self._started = time.monotonic()
        self._first: float | None = None  # when the first instance was done
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="posdebias-progress", daemon=True)

    def __enter__(self) -> ProgressLines:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()
        if self.printed and exc_info[0] is None and self.total is not None:
            self._print(
                f"{self.what}: {self.done:,}/{self.total:,} instances in "
                f"{duration(time.monotonic() - self._started)}"
            )

    def advance(self) -> None:
        with self._lock:
            self.done += 1
            if self._first is None:
                self._first = time.monotonic()

    def line(self, now: float | None = None) -> str:
        """The progress line at ``now``: instances done, rate and time left once known."""
        now = time.monotonic() if now is None else now
        with self._lock:
            done, first = self.done, self._first
        if self.total is None:  # the run has not said how many yet (loading, calibrating)
            return f"{self.what}: preparing, {duration(now - self._started)} so far"
        text = f"{self.what}: {done:,}/{self.total:,} instances"
        if first is None or done < 2 or now <= first:
            return f"{text}, {duration(now - self._started)} so far"
        rate = (done - 1) / (now - first)  # the first instance's own time is before `first`
        left = max(0, self.total - done)
        per = f"{rate:.2f} instances/s" if rate >= 0.1 else f"{60 * rate:.2f} instances/min"
        return f"{text}, {per}, about {duration(left / rate)} left"

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._print(self.line())

    def _print(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        print(text, file=stream, flush=True)
        self.printed += 1


class RunProgress:
    """Context manager; ``update(record, running_accuracy)`` is the runner's on_record hook.

    ``console`` is where the results go: a terminal gets the bar; otherwise progress lines go
    to stderr (:class:`ProgressLines`).
    """

    def __init__(self, console: Console, total: int | None = None) -> None:
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
        self._lines = None if console.is_terminal else ProgressLines(total)

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        if self._lines is not None:
            self._lines.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._lines is not None:
            self._lines.__exit__(*exc_info)
        self._progress.__exit__(*exc_info)

    def start(self, total: int) -> None:
        """The number of instances this run evaluates, once known (``total`` at construction
        is the requested count: the benchmark may hold fewer, a resumed run has some done)."""
        self._progress.update(self._task, total=total)
        if self._lines is not None:
            self._lines.total = total

    def update(self, record: object, accuracy: dict[str, float]) -> None:
        text = "  ".join(f"{one_line(label)} {value:.1f}%" for label, value in accuracy.items())
        self._progress.update(self._task, advance=1, accuracy=text)
        if self._lines is not None:
            self._lines.advance()
