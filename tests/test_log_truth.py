"""Metrics come from the benchmark's truth and the recorded choices, never from a log's own copy
of the truth: a run log (or a study's point file) edited to move the truth is refused with the
file, the line and what to do, through every command that reads one (``evaluate --resume``,
``report --compare``, ``sweep --resume``); nothing of the run is changed by the refusal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import build_shapes_benchmark
from helpers import cli_run as cli
from posdebias.cli import main

SIM = ("evaluate", "--adapter", "synthetic", "--calibrators", "vanilla,attention_guided")


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def edit_records(run: Path, edit, line: int | None = None) -> None:
    """Apply ``edit`` to the records of ``records.jsonl`` (all, or the one on ``line``)."""
    path = run / "records.jsonl"
    rows = [json.loads(text) for text in path.read_text().splitlines()]
    for number, row in enumerate(rows, start=1):
        if line is None or number == line:
            edit(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def vanillas_choices_as_targets(row: dict) -> None:
    """The issue's example: the truth moved onto vanilla's choices (vanilla would score 100)."""
    row["targets"] = list(row["choices"]["vanilla"])


def other_orders(row: dict) -> None:
    """Every order swapped for another permutation, the rest of the record made consistent
    with it (targets where the logged truth lands, chosen images), so only the orders lie."""
    n = len(row["orders"][0])
    swap = list(range(n))
    swap[0], swap[1] = swap[1], swap[0]
    truths = [order[t] for order, t in zip(row["orders"], row["targets"], strict=True)]
    row["orders"] = [[order[k] for k in swap] for order in row["orders"]]
    row["targets"] = [
        order.index(truth) for order, truth in zip(row["orders"], truths, strict=True)
    ]
    for label, choices in row["choices"].items():
        row["chosen"][label] = [order[c] for order, c in zip(row["orders"], choices, strict=True)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished simulated run: vanilla near chance, attention_guided far above."""
    run = tmp_path_factory.mktemp("truth") / "run"
    assert main([*SIM, "--count", "12", "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize(
    ("edit", "line", "message"),
    [
        (vanillas_choices_as_targets, None, "records.jsonl:1: the record of instance"),
        (vanillas_choices_as_targets, 7, "records.jsonl:7: the record of instance"),
        (other_orders, 12, "records.jsonl:12: the record of instance"),
    ],
)
def test_resume_refuses_a_record_log_that_moves_the_truth(
    finished_run, tmp_path, capsys, edit, line, message
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    edit_records(run, edit, line)
    before = tree(run)
    code, err = cli(capsys, *SIM, "--count", "12", "--out", run, "--resume")
    assert code == 2 and message in err, err
    expected = "has targets" if edit is vanillas_choices_as_targets else "shows the candidates in"
    assert expected in err and "delete the run directory (or choose a new --out)" in err
    assert tree(run) == before  # nothing of the run was changed, results.json included


def test_an_untouched_log_resumes_to_the_same_metrics(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    saved = json.loads((run / "results.json").read_text())
    assert cli(capsys, *SIM, "--count", "12", "--out", run, "--resume")[0] == 0
    again = json.loads((run / "results.json").read_text())
    for label in ("vanilla", "attention_guided"):
        assert again["calibrators"][label]["metrics"] == saved["calibrators"][label]["metrics"]
    assert saved["calibrators"]["vanilla"]["metrics"]["accuracy_mean"] < 80


def test_report_compare_refuses_a_run_whose_log_moves_the_truth(finished_run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    assert cli(capsys, "report", "--compare", finished_run, other)[0] == 0
    edit_records(other, vanillas_choices_as_targets, 5)
    code, err = cli(capsys, "report", "--compare", finished_run, other)
    assert code == 2 and "records.jsonl:5: the record of instance" in err, err
    assert "has targets" in err and "evaluate again into a new --out" in err


def test_report_compare_checks_a_benchmark_run_against_its_benchmark(tmp_path, capsys):
    bench = build_shapes_benchmark(tmp_path, count=8)
    run = tmp_path / "run"
    args = ["evaluate", "--adapter", "synthetic", "--benchmark", bench, "--count", "4"]
    assert cli(capsys, *args, "--calibration-count", "2", "--out", run)[0] == 0
    assert cli(capsys, "report", "--compare", run, run)[0] == 0
    build_shapes_benchmark(tmp_path, count=8, seed=3)  # another benchmark in its place
    capsys.readouterr()
    code, err = cli(capsys, "report", "--compare", run, run)
    assert code == 2 and "changed since" in err, err
    shutil.rmtree(bench)
    code, err = cli(capsys, "report", "--compare", run, run)
    assert code == 2 and "which cannot be read now" in err and "put the benchmark back" in err


SWEEP = ("sweep", "tau", "--values", "1,5", "--adapter", "synthetic", "--count", "6")


@pytest.mark.parametrize(
    ("key", "value"), [("accuracy", 100.0), ("rstd", 0.0), ("consistency", 99.0)]
)
def test_sweep_resume_refuses_a_point_file_that_disagrees_with_its_truth(
    tmp_path, capsys, key, value
):
    out = tmp_path / "sweep"
    assert cli(capsys, *SWEEP, "--out", out)[0] == 0
    csv = (out / "results.csv").read_bytes()
    assert cli(capsys, *SWEEP, "--out", out, "--resume")[0] == 0  # untouched: recomputed alike
    assert (out / "results.csv").read_bytes() == csv
    point = out / "points" / "001.json"
    payload = json.loads(point.read_text())
    payload["rows"][0][key] = value
    point.write_text(json.dumps(payload))
    before = tree(out)
    code, err = cli(capsys, *SWEEP, "--out", out, "--resume")
    assert code == 2 and "points/001.json disagrees with what its observations" in err, err
    assert f"{key} {value}" in err and "Delete it and --resume computes the point again" in err
    assert tree(out) == before
    point.unlink()
    assert cli(capsys, *SWEEP, "--out", out, "--resume")[0] == 0
    assert (out / "results.csv").read_bytes() == csv
