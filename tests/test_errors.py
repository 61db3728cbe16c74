"""The bad-input table of docs/errors.md: one test per row, through the real CLI.

Each case checks the exit code (2 for usage/input errors), a message naming the offending value
and the fix, no traceback, and no partial output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from posdebias.cli import main


def run(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


def calibrate(tmp_path, capsys, *extra):
    out = tmp_path / "cal"
    code, err = run(["calibrate", "--adapter", "synthetic", "--out", out, *extra], capsys)
    assert code == 0, err
    return out


# row 4: N beyond the label set / N < 2 -------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "message"),
    [
        ("1", "-N: Input should be greater than or equal to 2"),
        ("27", "-N: Input should be less than or equal to 26"),
    ],
)
def test_row4_candidate_count_bounds(tmp_path, capsys, n, message):
    code, err = run(
        ["evaluate", "--adapter", "synthetic", "-N", n, "--out", tmp_path / "r"], capsys
    )
    assert code == 2 and "n: Input should be" in err
    assert not (tmp_path / "r").exists()


def test_row4_more_images_than_the_label_set_can_name():
    from posdebias.adapters.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import InputError

    instance = synthetic_instances(1, 27)[0]
    with pytest.raises(InputError, match="N=27 candidates, but label set 'upper' can name at most"):
        SyntheticAdapter(label_set="upper").observe(instance)


# row 6: calibration files --------------------------------------------------------------------


def test_row6_missing_calibration(tmp_path, capsys):
    code, err = run(["evaluate", "--calibration", tmp_path / "nope.json", "--count", "2"], capsys)
    assert code == 2 and "does not exist" in err and "posdebias calibrate" in err


def test_row6_corrupt_calibration(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, err = run(["evaluate", "--calibration", bad, "--count", "2"], capsys)
    assert code == 2 and "not valid JSON" in err


def test_row6_wrong_schema_version(tmp_path, capsys):
    states = calibrate(tmp_path, capsys)
    path = states / "attention_guided.json"
    payload = json.loads(path.read_text())
    payload["schema_version"] = 0
    path.write_text(json.dumps(payload))
    code, err = run(["evaluate", "--calibration", states, "--count", "2"], capsys)
    assert code == 2 and "schema version 0 is not supported" in err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("num_layers: 5", "layers but the model has 5"),
        ("label_set: upper", "its labels are ['1', '2', '3', '4'], not ['A', 'B', 'C', 'D']"),
    ],
)
def test_row6_calibration_for_another_model(tmp_path, capsys, option, message):
    states = calibrate(tmp_path, capsys)
    config = tmp_path / "c.yaml"
    config.write_text(f"adapter: {{name: synthetic, options: {{{option}}}}}\n")
    code, err = run(
        ["evaluate", "--config", config, "--calibration", states, "--count", "2"], capsys
    )
    assert code == 2 and message in err


def test_row6_calibration_from_another_adapter(tmp_path, capsys):
    states = calibrate(tmp_path, capsys)
    path = states / "pride.json"
    payload = json.loads(path.read_text())
    payload["adapter"] = "qwen2_vl"
    path.write_text(json.dumps(payload))
    code, err = run(
        ["evaluate", "--calibration", path, "--calibrators", "pride", "--count", "2"], capsys
    )
    assert code == 2 and "adapter 'qwen2_vl', not 'synthetic'" in err


# row 7: unknown names and options ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--calibrators", "vanilla,atention_guided"],
            "unknown calibrator 'atention_guided'; known calibrators: attention_guided",
        ),
        (["--adapter", "qwen"], "unknown adapter 'qwen'; known adapters:"),
    ],
)
def test_row7_unknown_names(capsys, args, message):
    code, err = run(["evaluate", *args, "--count", "2"], capsys)
    assert code == 2 and message in err and "docs/plugins.md" in err


def test_row7_unknown_calibrator_option(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("calibrators: {attention_guided: {topk: 3}}\n")
    code, err = run(["evaluate", "--config", config], capsys)
    assert code == 2 and "unknown option 'topk'" in err and "top_k" in err


# row 11: config typos and wrong types ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("cuont: 3\n", "unknown key 'cuont'"),
        ("orders: [1, 2]\n", "orders: Input should be a valid integer"),
        ("adapter: {name: synthetic, options: {noise: loud}}\n", "noise: Input should be a valid"),
        ("orders: 3\n  bad: indent\n", "cannot be parsed"),
    ],
)
def test_row11_config_errors_name_the_field(tmp_path, capsys, content, message):
    config = tmp_path / "c.yaml"
    config.write_text(content)
    code, err = run(["evaluate", "--config", config], capsys)
    assert code == 2 and message in err


# row 12: --resume on another configuration ---------------------------------------------------


def test_row12_resume_with_other_configuration(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["evaluate", "--count", "4", "--orders", "2", "--out", out], capsys)[0] == 0
    code, err = run(
        ["evaluate", "--count", "4", "--orders", "2", "--seed", "1", "--out", out, "--resume"],
        capsys,
    )
    assert code == 2 and "seed: 0 there, 1 now" in err


# row 13: output not writable / disk full ------------------------------------------------------


def test_row13_output_directory_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, err = run(["evaluate", "--count", "2", "--out", blocker / "run"], capsys)
    assert code == 2 and "cannot create output directory" in err


def test_row13_disk_full_during_a_run_keeps_what_was_written(tmp_path, capsys):
    """The records log points at /dev/full: every append fails with ENOSPC, as on a full disk."""
    out = tmp_path / "run"
    out.mkdir()
    os.symlink("/dev/full", out / "records.jsonl")
    code, err = run(["evaluate", "--count", "6", "--orders", "2", "--out", out], capsys)
    assert code == 2 and "disk is full" in err
    assert not (out / "results.json").exists()
    kept = (out / "observations.jsonl").read_text().splitlines()
    assert kept and all(json.loads(line)["key"] for line in kept)
    # space freed: the run resumes from what was kept
    (out / "records.jsonl").unlink()
    code, err = run(["evaluate", "--count", "6", "--orders", "2", "--out", out, "--resume"], capsys)
    assert code == 0, err and Path(out / "results.json").exists()


# row 15: broken plugins -> tests/test_registry.py (import error, unknown hook) ----------------
