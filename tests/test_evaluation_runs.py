"""End-to-end runs on the simulated model: calibrate -> evaluate -> report, resume, refuse."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import posdebias.defaults as defaults
from helpers import (
    build_shapes_benchmark,
    interrupted_cli,
    line_count,
    main_without_latency,
    without_figures_path,
)
from posdebias import CalibrationState
from posdebias.cli import main
from posdebias.evaluation.results import EvaluationResults

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def evaluate(*args: object) -> int:
    """`posdebias evaluate` on the simulated model, arguments stringified."""
    return main(["evaluate", "--adapter", "synthetic", *map(str, args)])


def results_without_timing(path: Path) -> dict:
    payload = json.loads((path / "results.json").read_text())
    payload.pop("timing")
    return payload


@pytest.mark.figures("png")
def test_calibrate_evaluate_report(tmp_path, capsys):
    states = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--out", str(states)]) == 0
    saved = sorted(p.name for p in states.glob("*.json"))
    assert saved == [
        "attention_guided.json",
        "attention_readout.json",
        "pride.json",
        "purified_attention.json",
    ]
    state = CalibrationState.load(states / "attention_guided.json")
    m = defaults.CALIBRATION_COUNT  # M, each instance in its 4 rotations
    assert state.num_observations == m * 4 and len(state.calibration_ids) == m
    assert state.adapter == "synthetic" and state.label_set == ["1", "2", "3", "4"]

    run = tmp_path / "run"
    code = evaluate(
        "--calibration",
        states,
        "--calibrators",
        "vanilla, attention_guided",
        "--count",
        "30",
        "--orders",
        "3",
        "--out",
        run,
    )
    assert code == 0
    results = EvaluationResults.load(run / "results.json")
    assert list(results.calibrators) == ["vanilla", "attention_guided"]
    assert results.calibrators["attention_guided"].metrics.num_orders == 3
    for figure in ("confusion", "recall", "divergence", "layers"):
        assert (run / "figures" / f"{figure}.png").read_bytes().startswith(PNG_MAGIC)
    assert "figures/confusion.png" in (run / "report.md").read_text()
    # the report command re-renders the same figures from the saved results
    before = (run / "figures" / "confusion.png").read_bytes()
    (run / "figures" / "confusion.png").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "figures" / "confusion.png").read_bytes() == before


def test_results_schema_round_trips(tmp_path):
    assert evaluate("--count", "10", "--orders", "2", "--out", tmp_path) == 0
    loaded = EvaluationResults.load(tmp_path / "results.json")
    again = tmp_path / "again.json"
    loaded.save(again)
    assert EvaluationResults.load(again) == loaded
    assert loaded.settings.seed == 0 and "posdebias" in loaded.versions


def test_calibration_for_another_n_is_refused(tmp_path, capsys):
    states = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "-N", "5", "--out", str(states)]) == 0
    code = evaluate("--calibration", states, "--count", "5")
    assert code == 2
    err = capsys.readouterr().err
    assert "made for N=5 candidates, not N=4" in err and "posdebias calibrate" in err


def test_same_seed_gives_byte_identical_results_apart_from_timing(tmp_path):
    for name in ("a", "b"):
        assert evaluate("--count", "25", "--orders", "2", "--out", tmp_path / name) == 0
    assert results_without_timing(tmp_path / "a") == results_without_timing(tmp_path / "b")


def test_adding_a_calibrator_to_a_finished_run_reuses_observations(tmp_path):
    run = tmp_path / "run"
    assert evaluate("--calibrators", "vanilla", "--count", "15", "--orders", "2", "--out", run) == 0
    lines_before = (run / "observations.jsonl").read_text().count("\n")
    assert (
        evaluate(
            "--calibrators",
            "vanilla, attention_guided, pride",
            "--count",
            "15",
            "--orders",
            "2",
            "--out",
            run,
            "--resume",
        )
        == 0
    )
    lines = (run / "observations.jsonl").read_text().splitlines()
    results = EvaluationResults.load(run / "results.json")
    assert set(results.calibrators) == {"vanilla", "attention_guided", "pride"}
    # no test view is observed again; only the calibration set, which vanilla alone never
    # needed (a calibrator that needs no fit costs no forward pass)
    added = {json.loads(line)["key"].split("#")[0] for line in lines[lines_before:]}
    assert added and added <= set(results.calibration_ids)


def test_existing_run_directory_needs_resume_and_same_configuration(tmp_path, capsys):
    run = tmp_path / "run"
    assert evaluate("--count", "5", "--orders", "2", "--out", run) == 0
    assert evaluate("--count", "5", "--orders", "2", "--out", run) == 2
    assert "--resume" in capsys.readouterr().err
    assert evaluate("--count", "5", "--orders", "3", "--out", run, "--resume") == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "orders: 2 there, 3 now" in err


@pytest.mark.parametrize("signal_to_send", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_resumes_to_the_uninterrupted_report(tmp_path, signal_to_send):
    """Kill a real `posdebias evaluate` process mid-run, resume it, and compare with a run
    that was never interrupted: same results, no duplicated or lost records."""
    config = tmp_path / "slow.yaml"
    config.write_text(
        "adapter: {name: synthetic, options: {latency: 0.004}}\ncount: 60\norders: 3\n"
    )
    args = ["evaluate", "--adapter", "synthetic", "--config", str(config)]
    reference = tmp_path / "reference"
    assert main_without_latency([*args, "--out", reference]) == 0

    run = tmp_path / "run"
    records = run / "records.jsonl"
    code, err = interrupted_cli(
        [*args, "--out", run], lambda: line_count(records) >= 10, signal_to_send
    )
    # SIGINT: the CLI's own exit code for an interrupt (128 + 2); SIGKILL: killed by the signal
    assert code == (130 if signal_to_send == signal.SIGINT else -signal.SIGKILL)
    assert not (run / "results.json").exists()
    done = records.read_text().count("\n")
    assert 10 <= done < 60
    if signal_to_send == signal.SIGINT:
        assert "--resume" in err and "Traceback" not in err

    assert main_without_latency([*args, "--out", run, "--resume"]) == 0
    assert results_without_timing(run) == results_without_timing(reference)
    ids = [json.loads(line)["instance_id"] for line in records.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 60


@pytest.mark.slow
def test_data_parallel_run_equals_single_process(tmp_path):
    """`accelerate launch` with 2 CPU processes (gloo) merges into the single-process report."""
    single = tmp_path / "single"
    args = ["evaluate", "--adapter", "synthetic", "--count", "21", "--orders", "2"]
    assert main([*args, "--out", str(single)]) == 0
    parallel = tmp_path / "parallel"
    accelerate = Path(sys.executable).with_name("accelerate")
    launch = "launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no"
    # `-m posdebias` with the report's figures off (nothing here reads them)
    command = [str(accelerate), *launch.split(), "--dynamo_backend", "no"]
    command += ["-m", "posdebias_without_figures"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}  # torchelastic's too
    env["PYTHONPATH"] = without_figures_path(tmp_path / "launcher")
    result = subprocess.run(
        [*command, *args, "--out", str(parallel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in parallel.glob("records.rank*.jsonl")) == [
        "records.rank0.jsonl",
        "records.rank1.jsonl",
    ]
    assert results_without_timing(parallel) == results_without_timing(single)


def test_benchmark_calibration_is_held_out_of_the_test_set(tmp_path):
    bench = build_shapes_benchmark(tmp_path, count=30, n=4)
    run = tmp_path / "run"
    assert evaluate("--benchmark", bench, "--orders", "2", "--out", run) == 0
    results = EvaluationResults.load(run / "results.json")
    m = defaults.CALIBRATION_COUNT  # the default M is held out
    assert len(results.calibration_ids) == m and results.num_instances == 30 - m
    assert not set(results.calibration_ids) & set(results.test_ids)
    # `calibrate` holds out the same instances with the same seed
    states = tmp_path / "states"
    args = ["calibrate", "--adapter", "synthetic", "--benchmark", str(bench), "--out", str(states)]
    assert main(args) == 0
    state = CalibrationState.load(states / "attention_guided.json")
    assert state.calibration_ids == results.calibration_ids
