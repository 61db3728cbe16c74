"""Progress where the user looks: a bar in a terminal, steady lines on stderr elsewhere."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from posdebias.cli import main
from posdebias.evaluation.progress import (
    INTERVAL,
    ProgressLines,
    RunProgress,
    duration,
    line_interval,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (41.6, "42s"), (60, "1m 00s"), (308, "5m 08s"), (7380, "2h 03m"), (-3, "0s")],
)
def test_durations_read_as_people_read_them(seconds, text):
    assert duration(seconds) == text


def test_a_line_gives_instances_done_rate_and_time_left():
    lines = ProgressLines(200, stream=io.StringIO(), interval=60)
    assert re.fullmatch(r"evaluating: 0/200 instances, \d+s so far", lines.line())
    for _ in range(5):
        lines.advance()
    first = lines._first
    # 4 instances in the 8 s after the first one: 0.5/s, 195 left: 6m 30s
    assert lines.line(now=first + 8) == (
        "evaluating: 5/200 instances, 0.50 instances/s, about 6m 30s left"
    )
    assert lines.line(now=first + 400) == (
        "evaluating: 5/200 instances, 0.60 instances/min, about 5h 25m left"
    )


def test_the_interval_comes_from_the_environment_within_bounds(monkeypatch):
    monkeypatch.delenv("POSDEBIAS_PROGRESS_SECONDS", raising=False)
    assert line_interval() == INTERVAL == 30
    for value, expected in (("5", 5.0), ("0.5", 0.5), ("0", INTERVAL), ("x", INTERVAL)):
        monkeypatch.setenv("POSDEBIAS_PROGRESS_SECONDS", value)
        assert line_interval() == expected


def test_lines_come_at_a_steady_pace_while_nothing_is_done_and_end_with_a_summary():
    stream = io.StringIO()
    with ProgressLines(3, stream=stream, interval=0.05) as lines:
        import time

        time.sleep(0.3)  # loading, calibrating: no instance yet, the lines still come
        for _ in range(3):
            lines.advance()
    text = stream.getvalue().splitlines()
    assert len(text) >= 3 and all(" so far" in line for line in text[:2])
    assert re.fullmatch(r"evaluating: 3/3 instances in \d+s", text[-1])


def test_a_quick_run_prints_no_line():
    stream = io.StringIO()
    with ProgressLines(3, stream=stream, interval=60) as lines:
        lines.advance()
    assert stream.getvalue() == ""


def test_a_terminal_keeps_its_bar_and_gets_no_lines(capsys):
    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    with RunProgress(terminal, 2) as progress:
        progress.update(None, {"vanilla": 50.0})
    assert progress._lines is None and not progress._progress.disable
    assert capsys.readouterr().err == ""
    piped = Console(file=io.StringIO(), force_terminal=False)
    assert RunProgress(piped, 2)._lines is not None and RunProgress(piped, 2)._progress.disable


def test_evaluate_into_a_file_prints_progress_lines_on_stderr(monkeypatch, capsys):
    monkeypatch.setenv("POSDEBIAS_PROGRESS_SECONDS", "0.1")
    args = ["evaluate", "--adapter", "synthetic", "--count", "40", "--orders", "2"]
    assert main(args) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines, "no progress line"
    pattern = (  # before the total is known (a slow start): "preparing"
        r"evaluating: (preparing, \d+s so far|[\d,]+/40 instances, (\d+s so far|"
        r"[\d.]+ instances/(s|min), about .+ left))"
    )
    assert all(re.fullmatch(pattern, line) for line in lines[:-1]), lines
    assert re.fullmatch(r"evaluating: 40/40 instances in .+", lines[-1])
    assert "evaluating" not in captured.out  # the results file stays clean


@pytest.mark.parametrize("resume", [False, True])
def test_the_progress_total_is_what_the_run_evaluates(tmp_path, monkeypatch, capsys, resume):
    # a benchmark of 64 with 4 held out has 60 test instances: the line said "/200"
    from helpers import build_shapes_benchmark, line_count

    monkeypatch.setenv("POSDEBIAS_PROGRESS_SECONDS", "0.1")
    bench = build_shapes_benchmark(tmp_path, count=64, n=3)
    out = tmp_path / "run"
    args = ["evaluate", "--adapter", "synthetic", "--benchmark", str(bench),
            "--calibration-count", "4", "--orders", "2", "--out", str(out)]  # fmt: skip
    expected = 60
    if resume:  # a run cut after 10 records: the resumed one evaluates the other 50
        assert main(args) == 0
        records = out / "records.jsonl"
        records.write_text("".join(records.read_text().splitlines(keepends=True)[:10]))
        (out / "results.json").unlink()
        args, expected = [*args, "--resume"], 50
        assert line_count(records) == 10
    capsys.readouterr()
    assert main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    # a tick before the total is known says "preparing" (how often depends on the machine's
    # speed); every line after it names the total the run evaluates
    counted = [line for line in lines if not line.startswith("evaluating: preparing")]
    assert lines[: len(lines) - len(counted)] == [line for line in lines if line not in counted]
    assert counted and all(f"/{expected} instances" in line for line in counted), lines
    assert lines[-1].startswith(f"evaluating: {expected}/{expected} instances in ")
