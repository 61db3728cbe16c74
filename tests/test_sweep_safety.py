"""A study's run directory is as safe as an evaluation's: hostile files, links, locks, swaps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import build_shapes_benchmark
from posdebias._io import DirectoryLock
from posdebias.cli import main

ARGS = [
    "--values",
    "1,2",
    "--count",
    "4",
    "--orders",
    "2",
    "--calibrators",
    "attention_guided,vanilla",
]


def sweep(out: Path, *extra: object) -> int:
    return main(
        ["sweep", "tau", "--adapter", "synthetic", "--out", str(out), *ARGS, *map(str, extra)]
    )


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    out = tmp_path / "study"
    assert sweep(out) == 0
    return out


def resume(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = sweep(out, "--resume")
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["sweep.json", "timing.json", "points/001.json"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_a_sweep_file_that_is_not_a_regular_file_is_refused_at_once(finished, capsys, name, kind):
    """/dev/zero would be read for ever, a FIFO waited on: both are refused before a read."""
    path = finished / name
    path.unlink()
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    code, err = resume(finished, capsys)
    assert code == 2, err
    assert "internal error" not in err
    assert name.split("/")[-1] in err
    assert any(
        words in err for words in ("symbolic link", "not a regular file", "is a directory")
    ), err


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(b"\xff\xfe not utf-8"), "not UTF-8 text"),
        (lambda p: p.write_text("{"), "not valid JSON"),
        (lambda p: p.write_text("[]"), "is not one posdebias wrote"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "keys": "abc"})),
            "is not one posdebias wrote",
        ),
        (
            lambda p: p.write_text(
                json.dumps(
                    {
                        **json.loads(p.read_text()),
                        "rows": [{**json.loads(p.read_text())["rows"][0], "accuracy": 500.0}],
                    }
                )
            ),
            "accuracy",
        ),
        (lambda p: p.write_text('{"label": "tau=2", "rows": [], "keys": []}'), "rows"),
    ],
)
def test_a_malformed_point_file_is_refused_with_its_name(finished, capsys, damage, expected):
    point = finished / "points" / "001.json"
    damage(point)
    before = (finished / "results.csv").read_bytes()
    code, err = resume(finished, capsys)
    assert code == 2 and "internal error" not in err, err
    assert "001.json" in err and expected in err
    assert (finished / "results.csv").read_bytes() == before


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b"\x80\x81"),
        lambda p: p.write_text('{"points": {"tau=1": {"seconds": -1}}}'),
        lambda p: p.write_text('{"points": 3}'),
    ],
)
def test_a_malformed_timing_file_is_refused(finished, capsys, damage):
    damage(finished / "timing.json")
    code, err = resume(finished, capsys)
    assert code == 2 and "timing.json" in err and "internal error" not in err, err


def test_a_symlinked_points_folder_is_never_written_through(finished, tmp_path, capsys):
    """SECURITY: --resume must not write 000.json .. into the link's target."""
    outside = tmp_path / "mine"
    outside.mkdir()
    (outside / "000.json").write_text("my own file\n")
    for point in (finished / "points").iterdir():
        point.unlink()
    (finished / "points").rmdir()
    (finished / "points").symlink_to(outside)
    code, err = resume(finished, capsys)
    assert code == 2 and "symbolic link" in err, err
    assert sorted(p.name for p in outside.iterdir()) == ["000.json"]
    assert (outside / "000.json").read_text() == "my own file\n"


@pytest.mark.parametrize("name", ["points/000.json", "observations.jsonl", "sweep.json"])
def test_a_file_linked_to_an_outside_file_is_neither_read_nor_written(
    finished, tmp_path, capsys, name
):
    target = finished / name
    outside = tmp_path / "outside.json"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    before = outside.read_bytes()
    code, err = resume(finished, capsys)
    assert code == 2 and "symbolic link" in err, err
    assert outside.read_bytes() == before


def test_a_second_process_on_a_sweep_directory_is_refused(finished, capsys):
    with DirectoryLock(finished):
        code, err = resume(finished, capsys)
    assert code == 2 and "in use by another posdebias process (pid " in err
    lines = (finished / "observations.jsonl").read_text().count("\n")
    assert resume(finished, capsys)[0] == 0
    assert (finished / "observations.jsonl").read_text().count("\n") == lines


def test_a_sweep_file_of_a_newer_format_is_refused(finished, capsys):
    marker = finished / "sweep.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format_version": 99}))
    code, err = resume(finished, capsys)
    assert code == 2 and "written by a newer posdebias (format version 99" in err


@pytest.mark.parametrize("version", ["1", 0, True])
def test_a_sweep_file_with_a_nonsense_format_is_refused(finished, capsys, version):
    marker = finished / "sweep.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format_version": version}))
    code, err = resume(finished, capsys)
    assert code == 2 and "is not one posdebias writes" in err


def test_a_benchmark_swapped_under_the_same_path_refuses_resume(tmp_path, capsys):
    """Identity by content: a new benchmark at the old path is not mixed with old points."""
    bench = build_shapes_benchmark(tmp_path / "a", count=12, n=3, seed=1)
    other = build_shapes_benchmark(tmp_path / "b", count=12, n=3, seed=2)
    out = tmp_path / "study"
    assert sweep(out, "--benchmark", bench, "--calibration-count", "5") == 0
    for name in ("benchmark.jsonl", "manifest.json"):
        (bench / name).write_bytes((other / name).read_bytes())
    (out / "points" / "001.json").unlink()
    capsys.readouterr()
    assert sweep(out, "--benchmark", bench, "--calibration-count", "5", "--resume") == 2
    err = capsys.readouterr().err
    assert "different study or configuration (differs in: benchmarks_sha256" in err


def test_a_sweep_directory_with_a_foreign_file_is_refused(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert sweep(out) == 2
    assert "is not empty and is not a posdebias sweep directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_non_utf8_bytes_in_the_observation_log_are_a_clear_error(finished, capsys):
    log = finished / "observations.jsonl"
    log.write_bytes(log.read_bytes() + b"\xff\xfe\n")
    code, err = resume(finished, capsys)
    assert code == 2 and "the run log is corrupt (not UTF-8 text" in err, err
