"""Class 7 (docs/errors.md, H40): every command that writes goes through the one run-directory
layer, so a user's file, folder or dangling link where a command would write is never replaced:
the command stops with exit 2 naming it, or writes beside it, and the entry is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import build_shapes_benchmark
from helpers import cli_run as cli

SIM = ("evaluate", "--adapter", "synthetic")
CAL = ("calibrate", "--adapter", "synthetic")
SWEEP = ("sweep", "tau", "--values", "1", "--adapter", "synthetic", "--count", "2")
FIGURE_NAMES = ("figure.png", "figure.pdf", "figure.svg")  # a study's figure


def _commands(tmp_path: Path, out: Path) -> dict[str, list[object]]:
    """Every command that writes a folder or a file the user names, writing to ``out``."""
    bench = build_shapes_benchmark(tmp_path / "inputs", count=6, n=2)
    shapes = tmp_path / "inputs" / "shapes"
    return {
        "evaluate": [*SIM, "--count", "2", "--out", out],
        "sweep": [*SWEEP, "--calibrators", "attention_guided", "--out", out],
        # the inputs' count: the shapes root is reused, not regenerated at the default count
        "build": [
            *("build", "--source", "shapes", "--root", shapes, "--count", "6", "-N", "2"),
            *("--out", out),
        ],
        "build shapes root": [
            *("build", "--source", "shapes", "--root", out, "--count", "6", "-N", "2"),
            *("--out", tmp_path / "built"),
        ],
        "calibrate": [*CAL, "--out", out],
        "calibrate one file": [*CAL, "--calibrators", "pride", "--out", out],
        "lm-eval-task": ["lm-eval-task", "--benchmark", bench, "--name", "t", "--out", out],
        "lmms-eval-task": ["lmms-eval-task", "--benchmark", bench, "--name", "t", "--out", out],
        "organism train": ["organism", "train", "--out", out, "--steps", "1", "1", "1", "1"],
    }


def _entry(path: Path) -> tuple[str, object]:
    """What stands at ``path`` (to prove it was left as it was)."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return ("folder", sorted(p.name for p in path.iterdir()))
    return ("file", path.read_bytes())


@pytest.mark.parametrize("kind", ["dangling link", "link to a file of yours", "file of yours"])
@pytest.mark.parametrize(
    "command",
    [
        "evaluate",
        "sweep",
        "build",
        "build shapes root",
        "calibrate",
        "calibrate one file",
        "lm-eval-task",
        "lmms-eval-task",
        "organism train",
    ],
)
def test_a_users_entry_at_the_out_path_is_never_replaced(tmp_path, capsys, command, kind):
    out = tmp_path / "out" / ("mine.json" if command == "calibrate one file" else "target")
    args = _commands(tmp_path, out)[command]
    out.parent.mkdir()
    mine = tmp_path / "mine.txt"
    if kind == "dangling link":
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a file of yours":
        mine.write_text("mine\n")
        out.symlink_to(mine)
    else:
        out.write_text("mine\n")
    before = _entry(out)
    capsys.readouterr()
    code, err = cli(capsys, *args)
    assert code == 2, (command, kind, err)
    assert "internal error" not in err and str(out.name) in err, err
    assert _entry(out) == before
    assert not (tmp_path / "nowhere").exists()
    assert not mine.exists() or mine.read_text() == "mine\n"


RESUMABLE = {"evaluate", "sweep"}
#: Commands writing into a folder shared with the user's files (a file there is theirs).
SHARED = {"lm-eval-task", "lmms-eval-task"}


@pytest.mark.parametrize(
    "command",
    [
        "evaluate",
        "sweep",
        "build",
        "build shapes root",
        "calibrate",
        "lm-eval-task",
        "lmms-eval-task",
        "organism train",
    ],
)
def test_a_dangling_link_at_a_written_name_is_never_replaced(tmp_path, capsys, command):
    """Written once, then each file the command wrote is swapped for a dangling link (in a
    folder shared with the user's files, also for a file of theirs) and the command is run
    again: the entry is left as it was, and the command stops (exit 2) or writes beside it."""
    out = tmp_path / "out" / "target"
    args = _commands(tmp_path, out)[command]
    code, err = cli(capsys, *args)
    assert code == 0, err
    written = sorted(
        p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".posdebias.lock")
    )
    assert written
    again = [*args, "--resume"] if command in RESUMABLE else args
    for number, path in enumerate(written):
        saved = path.read_bytes()
        path.unlink()
        if number % 2 and command in SHARED:
            path.write_text("mine\n")
        else:
            path.symlink_to(tmp_path / "nowhere")
        before = _entry(path)
        code, err = cli(capsys, *again)
        assert code in (0, 2), (command, path, err)
        assert _entry(path) == before, (command, path, code, err)
        assert not (tmp_path / "nowhere").exists(), (command, path)
        path.unlink()
        path.write_bytes(saved)


@pytest.mark.parametrize(
    "name",
    [
        "results.csv",
        *(pytest.param(name, marks=pytest.mark.figures) for name in FIGURE_NAMES),
        "report.md",
    ],
)
def test_a_link_planted_at_a_sweep_output_while_it_runs_is_left_and_nothing_is_written(
    tmp_path, name
):
    """The study's outputs are written together through the run-directory layer: a dangling
    link that appears at any of them during the run (figure.pdf and .svg were written beside
    figure.png unchecked) stops the write, and none of the outputs appears."""
    from posdebias.errors import OutputError
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.sweep import SweepSpec, run_sweep

    out = tmp_path / "study"
    config = EvaluateConfig(
        adapter={"name": "synthetic"}, count=2, orders=2, calibrators=["attention_guided"], out=out
    )

    def plant(point: object, payload: object) -> None:
        if not os.path.lexists(out / name):
            (out / name).symlink_to(tmp_path / "nowhere")

    with pytest.raises(OutputError, match="symbolic link"):
        run_sweep("tau", config, SweepSpec(values=[1.0]), out, on_point=plant)
    assert os.readlink(out / name) == str(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    outputs = {"results.csv", *FIGURE_NAMES, "report.md"}
    assert {p.name for p in out.iterdir()} & outputs == {name}


@pytest.mark.figures
def test_report_never_replaces_a_link_at_a_figure_or_report_md(tmp_path, capsys):
    """``posdebias report RUN`` writes its figures and report.md through the layer: a
    dangling link at any figure's name (it was replaced) or at report.md is refused before
    anything is written."""
    from posdebias.evaluation.figures import FORMATS, REPORT_FIGURES

    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as undone:  # the last report draws the figures
        undone.setattr("posdebias.evaluation.report.REPORT_FIGURES", ())
        code, err = cli(capsys, *SIM, "--count", "2", "--out", out)
    assert code == 0, err
    names = sorted(
        Path("figures", f"{name}.{fmt}") for name, _, _ in REPORT_FIGURES for fmt in FORMATS
    )
    (out / "figures").mkdir(exist_ok=True)
    for relative in [Path("report.md"), *names[:2], names[-1]]:
        path = out / relative
        path.unlink(missing_ok=True)
        path.symlink_to(tmp_path / "nowhere")
        others = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p != path}
        code, err = cli(capsys, "report", out)
        assert code == 2 and "symbolic link" in err and path.name in err, (relative, err)
        assert os.readlink(path) == str(tmp_path / "nowhere")
        written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p != path}
        assert written == others  # nothing else written, nothing new
        path.unlink()
    code, err = cli(capsys, "report", out)
    assert code == 0, err
    assert all((out / name).is_file() and not (out / name).is_symlink() for name in names)
