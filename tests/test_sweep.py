"""`posdebias sweep`: every study on the simulated model, shared cache, resume, refusals."""

from __future__ import annotations

import csv
import json
import math
import signal
from pathlib import Path

import pytest

from helpers import build_shapes_benchmark, interrupted_cli, line_count, main_without_latency
from posdebias.cli import main

#: A study's outputs; its figure (figure.png/.pdf/.svg) is drawn from results.csv alone, so the
#: tests marked ``figures`` check it, the others compare these.
FILES = ("results.csv", "report.md")
FIGURES = ("figure.png", "figure.pdf", "figure.svg")
CALIBRATORS = "vanilla,pride,attention_guided,permutation_average"


def sweep(study: str, out: Path, *args: object) -> int:
    argv = ["sweep", study, "--adapter", "synthetic", "--out", str(out), *map(str, args)]
    return main(argv)


def rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def by_point(table: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    points: dict[str, list[dict[str, str]]] = {}
    for row in table:
        points.setdefault(row["point"], []).append(row)
    return points


@pytest.mark.figures
def test_n_study_caps_orders_at_n_factorial_and_plots(tmp_path):
    out = tmp_path / "n"
    assert sweep("n", out, "--values", "2,3,4,6", "--count", "12", "--orders", "5",
                 "--calibrators", CALIBRATORS) == 0  # fmt: skip
    points = by_point(rows(out))
    assert list(points) == ["n=2", "n=3", "n=4", "n=6"]
    for label, mine in points.items():
        n = int(label.split("=")[1])
        assert [r["calibrator"] for r in mine] == CALIBRATORS.split(",")
        assert {int(r["n"]) for r in mine} == {n}
        assert {int(r["orders"]) for r in mine} == {min(5, math.factorial(n))}
        permutation = next(r for r in mine if r["calibrator"] == "permutation_average")
        assert int(permutation["forward_passes_per_instance"]) == min(5, math.factorial(n)) * n
    assert (out / "figure.png").read_bytes().startswith(b"\x89PNG")
    assert "## RStd" in (out / "report.md").read_text()


@pytest.mark.parametrize(("study", "values"), [("tau", "1,5,20"), ("top_k", "1,2,3")])
def test_option_studies_make_no_forward_pass_after_the_first_point(tmp_path, study, values):
    out = tmp_path / study
    assert sweep(study, out, "--values", values, "--count", "10", "--orders", "3") == 0
    table = rows(out)
    points = by_point(table)
    first, *later = points.values()
    assert int(first[0]["point_new_forward_passes"]) == int(first[0]["point_forward_passes"]) > 0
    assert all(int(r["point_new_forward_passes"]) == 0 for group in later for r in group)
    observations = (out / "observations.jsonl").read_text().count("\n")
    assert observations == int(first[0]["point_forward_passes"])
    # vanilla does not have the option: the same numbers at every point
    vanilla = {r["accuracy"] for r in table if r["calibrator"] == "vanilla"}
    assert len(vanilla) == 1
    guided = [r for r in table if r["calibrator"] == "attention_guided"]
    assert len(guided) == 3


def test_calibration_size_reuses_the_test_observations(tmp_path):
    out = tmp_path / "m"
    assert sweep("calibration_size", out, "--values", "1,2,5", "--count", "8", "--orders", "2") == 0
    points = by_point(rows(out))
    sizes = [int(group[0]["calibration_instances"]) for group in points.values()]
    assert sizes == [1, 2, 5]
    assert {group[0]["instances"] for group in points.values()} == {"8"}
    new = [int(group[0]["point_new_forward_passes"]) for group in points.values()]
    # later points only observe their added calibration instances (N views each)
    assert new[1:] == [(2 - 1) * 4, (5 - 2) * 4]


@pytest.mark.figures
def test_rerun_with_the_same_seed_is_byte_identical(tmp_path):
    args = ["--values", "2,3", "--count", "6", "--orders", "2"]
    assert sweep("n", tmp_path / "a", *args) == 0
    assert sweep("n", tmp_path / "b", *args) == 0
    assert "![figure](figure.png)" in (tmp_path / "a" / "report.md").read_text()
    for name in FILES + FIGURES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_existing_directory_needs_resume_and_the_same_study(tmp_path, capsys):
    out = tmp_path / "tau"
    assert sweep("tau", out, "--values", "1,2", "--count", "4", "--orders", "2") == 0
    assert sweep("tau", out, "--values", "1,2", "--count", "4", "--orders", "2") == 2
    assert "--resume" in capsys.readouterr().err
    assert sweep("tau", out, "--values", "1,3", "--count", "4", "--orders", "2", "--resume") == 2
    assert "different study or configuration" in capsys.readouterr().err
    # the setting that differs is named with both values, as `evaluate --resume` names it
    assert sweep("tau", out, "--values", "1,2", "--count", "4", "--orders", "3", "--resume") == 2
    err = capsys.readouterr().err
    assert "points.0.config.orders: 2 there, 3 now" in err and "points.1.config.orders" in err
    before = (out / "results.csv").read_bytes()
    assert sweep("tau", out, "--values", "1,2", "--count", "4", "--orders", "2", "--resume") == 0
    assert (out / "results.csv").read_bytes() == before


def test_killed_sweep_resumes_to_the_uninterrupted_files(tmp_path):
    """SIGKILL a real `posdebias sweep` process mid-study, resume it: the same files as a
    study that was never interrupted, and no observation made twice."""
    config = tmp_path / "slow.yaml"
    config.write_text(
        "adapter: {name: synthetic, options: {latency: 0.003}}\ncount: 20\norders: 2\n"
        "sweep: {values: [2, 3, 4, 5]}\n"
    )
    args = ["sweep", "n", "--config", str(config)]
    reference = tmp_path / "reference"
    assert main_without_latency([*args, "--out", reference]) == 0

    run = tmp_path / "run"
    point = run / "points" / "001.json"
    observations = run / "observations.jsonl"
    two_points: list[int] = []

    def third_point_observing() -> bool:
        if not point.exists():
            return False
        two_points[:] = two_points or [line_count(observations)]
        return line_count(observations) > two_points[0]

    code, _ = interrupted_cli([*args, "--out", run], third_point_observing)
    assert code == -signal.SIGKILL
    assert not (run / "results.csv").exists()
    made_before = (run / "observations.jsonl").read_text().count("\n")
    assert made_before > 0

    assert main_without_latency([*args, "--out", run, "--resume"]) == 0
    for name in FILES:
        assert (run / name).read_bytes() == (reference / name).read_bytes(), name
    keys = [
        json.loads(line)["key"] for line in (run / "observations.jsonl").read_text().splitlines()
    ]
    assert len(keys) == len(set(keys))  # nothing observed twice across the kill


def test_transfer_pairs_benchmarks_and_tests_b_on_the_same_instances(tmp_path):
    a = build_shapes_benchmark(tmp_path / "a", count=14, n=3, seed=1)
    b = build_shapes_benchmark(tmp_path / "b", count=14, n=3, seed=2)
    out = tmp_path / "transfer"
    args = ["--benchmarks", a, b, "--orders", "2", "--count", "6", "--calibration-count", "5"]
    assert sweep("transfer", out, *args) == 0
    points = by_point(rows(out))
    assert len(points) == 4
    pairs = {(g[0]["calibration_benchmark"], g[0]["benchmark"]) for g in points.values()}
    assert len(pairs) == 4
    # calibrated on a or on b, tested on b: only the calibration observations differ
    into_b = [g[0] for g in points.values() if g[0]["benchmark"] == g[1]["benchmark"] and
              g[0]["point"].endswith("-> " + g[0]["benchmark"])]  # fmt: skip
    assert into_b
    vanilla = {
        (r["calibration_benchmark"], r["benchmark"]): r["accuracy"]
        for r in rows(out)
        if r["calibrator"] == "vanilla"
    }
    names = sorted({pair[1] for pair in vanilla})
    for target in names:  # vanilla needs no calibration: same test set, same numbers
        assert len({acc for (_, tested), acc in vanilla.items() if tested == target}) == 1


def test_transfer_refuses_benchmarks_of_different_n(tmp_path, capsys):
    a = build_shapes_benchmark(tmp_path / "a", count=8, n=3)
    b = build_shapes_benchmark(tmp_path / "b", count=8, n=4)
    out = tmp_path / "transfer"
    assert sweep("transfer", out, "--benchmarks", a, b) == 2
    err = capsys.readouterr().err
    assert "same number of images per instance" in err and "N=3" in err and "N=4" in err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("second", ["same", "spelled", "copy"])
def test_transfer_refuses_a_benchmark_named_twice(tmp_path, capsys, second):
    """The same benchmark twice (the same folder, another spelling of it, a copy) would be
    four points of one in-domain pair: refused before anything runs."""
    import shutil

    a = build_shapes_benchmark(tmp_path / "a", count=8, n=3)
    other = {"same": a, "spelled": f"{a}/./", "copy": shutil.copytree(a, tmp_path / "copy")}
    out = tmp_path / "transfer"
    assert sweep("transfer", out, "--benchmarks", a, other[second]) == 2
    err = capsys.readouterr().err
    assert "benchmarks repeat (the same content)" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("study", "args", "message"),
    [
        ("transfer", ["--benchmarks", "ONE"], "at least two benchmarks"),
        ("tau", ["--values", "1,1"], "repeat"),
        ("top_k", ["--values", "1.5"], "whole numbers"),
        ("n", ["--values", "1,2"], "at least 2"),
        ("tau", ["--values", "x"], "comma-separated numbers"),
        ("top_k", ["--values", "1,,2"], "comma-separated numbers"),
        ("top_k", ["--values", "1,2,"], "comma-separated numbers"),
        ("tau", ["--values", "1,nan"], "finite number"),
        ("tau", ["--values", "1,inf"], "finite number"),
        ("tau", ["--values", "1,1e999"], "finite number"),
        ("tau", ["--values", "1,1e308"], "Input should be less than or equal to 1000000000000"),
        ("calibration_size", ["--values", "2,-1e308"], "greater than or equal to -100000"),
        ("n", ["--benchmark", "bench-without-pattern"], "pattern with {n}"),
        ("tau", ["--calibrators", "vanilla,pride"], "needs a calibrator with the option"),
    ],
)
def test_bad_sweeps_are_clear_errors_before_any_work(tmp_path, capsys, study, args, message):
    out = tmp_path / "out"
    assert sweep(study, out, *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e308", "-1e308", "1e999"])
def test_a_sweep_config_file_value_that_is_not_finite_or_absurd_is_refused(tmp_path, capsys, value):
    """A study's values from its config file are finite and bounded like every decimal read
    from a file (1e308 named its point by 309 digits); exit 2 naming the file, nothing made."""
    config = tmp_path / "study.yaml"
    config.write_text(f"adapter: {{name: synthetic}}\ncount: 2\nsweep:\n  values: [1, {value}]\n")
    out = tmp_path / "out"
    assert main(["sweep", "tau", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "study.yaml" in err and "values.1" in err and "Traceback" not in err, err
    assert "finite number" in err or "or equal to" in err, err
    assert not out.exists()


def untimed(log: Path) -> list[dict]:
    """The decisions of a generation log without their seconds (the only part that varies)."""
    decided = [json.loads(line) for line in log.read_text().splitlines()]
    for row in decided:
        row["decision"].pop("seconds")
    return decided


def test_decoder_rows_join_every_point_and_generate_once(tmp_path):
    """The paper's generated baselines in a study: a row per decoder at every point, their
    answers generated once and re-used by the later points, byte-identical on a rerun and
    after a resume."""
    out = tmp_path / "tau"
    args = ["--values", "1,5", "--count", "8", "--orders", "2", "--calibrators",
            "vanilla,attention_guided", "--decoders", "generated,instruction"]  # fmt: skip
    assert sweep("tau", out, *args) == 0
    points = by_point(rows(out))
    assert list(points) == ["tau=1", "tau=5"]
    for mine in points.values():
        labels = [r["calibrator"] for r in mine]
        assert labels == ["vanilla", "attention_guided", "generated", "instruction"]
    generated = [
        row for mine in points.values() for row in mine if row["calibrator"] != "attention_guided"
    ]
    first, second = points["tau=1"], points["tau=5"]
    for a, b in zip(first, second, strict=True):
        if a["calibrator"] != "attention_guided":  # nothing but tau changed between the points
            assert (a["accuracy"], a["rstd"], a["consistency"]) == (
                b["accuracy"],
                b["rstd"],
                b["consistency"],
            )
    assert all(float(row["forward_passes_per_instance"]) >= 2 for row in generated)
    decided = (out / "generations.jsonl").read_text().splitlines()
    assert len(decided) == 2 * 8 * 2  # two decoders x 8 instances x 2 orders, once for both points
    again = tmp_path / "again"
    assert sweep("tau", again, *args) == 0
    for name in FILES:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    assert untimed(again / "generations.jsonl") == untimed(out / "generations.jsonl")
    before = (again / "generations.jsonl").read_text()
    (again / "points" / "001.json").unlink()  # as if killed before the second point finished
    assert sweep("tau", again, *args, "--resume") == 0
    assert (again / "generations.jsonl").read_text() == before  # nothing generated again
    for name in FILES:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_an_unknown_decoder_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep("tau", out, "--decoders", "generated,nonsense") == 2
    err = capsys.readouterr().err
    assert "nonsense" in err and "Traceback" not in err
    assert not out.exists()


def test_a_decoder_the_adapter_cannot_run_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep("tau", out, "--decoders", "cloze") == 2  # the simulated model scores no text
    err = capsys.readouterr().err
    assert "cannot score a text as the model's reply" in err and "Traceback" not in err
    assert not out.exists()


def _finished_decoder_study(tmp_path: Path) -> tuple[Path, list[str]]:
    out = tmp_path / "study"
    args = ["--values", "1", "--count", "4", "--orders", "2", "--decoders", "generated"]
    assert sweep("top_k", out, *args) == 0
    for point in (out / "points").iterdir():
        point.unlink()  # the resume must re-read the logs
    return out, args


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: {**d, "choice": "abc"},
        lambda d: {**d, "choice": 99},
        lambda d: {**d, "choice": True},
        lambda d: {**d, "texts": [1]},
        lambda d: {**d, "forward_passes": -1},
        lambda d: {k: v for k, v in d.items() if k != "answers"},
    ],
)
def test_a_tampered_generation_log_is_refused_on_resume(tmp_path, capsys, damage):
    out, args = _finished_decoder_study(tmp_path)
    log = out / "generations.jsonl"
    lines = log.read_text().splitlines()
    record = json.loads(lines[1])
    record["decision"] = damage(record["decision"])
    lines[1] = json.dumps(record)
    log.write_text("\n".join(lines) + "\n")
    assert sweep("top_k", out, *args, "--resume") == 2
    err = capsys.readouterr().err
    named = "generations.jsonl: record 2: a run log record is corrupt (not a decision"
    assert "generation log" in err or named in err, err
    assert "internal error" not in err and not (out / "points" / "000.json").exists()


@pytest.mark.parametrize("name", ["generations.jsonl", "observations.jsonl"])
def test_a_fifo_in_the_study_directory_is_refused_not_waited_on(tmp_path, capsys, name):
    import os

    out, args = _finished_decoder_study(tmp_path)
    (out / name).unlink()
    os.mkfifo(out / name)
    assert sweep("top_k", out, *args, "--resume") == 2  # returns: no open() blocks on the FIFO
    err = capsys.readouterr().err
    assert "not a regular file" in err and "internal error" not in err


def test_a_point_whose_benchmark_has_another_n_is_refused_before_any_point_runs(tmp_path, capsys):
    """The n study's point n=3 read a benchmark of pairs and was reported as N = 3."""
    from real_models import wordnet_benchmark

    for n in (2, 3):
        wordnet_benchmark("capitals", 12, 2, 0, tmp_path / f"bench-n{n}")  # both hold pairs
    out = tmp_path / "study"
    argv = ["sweep", "n", "--adapter", "synthetic", "--benchmark", str(tmp_path / "bench-n{n}"),
            "--values", "2,3", "--count", "4", "--orders", "2", "--calibration-count", "4",
            "--out", str(out)]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "N = 3 was asked for (-N, n in the config, or a study's value)" in err
    assert "bench-n3) have 2 options each; ask for N = 2" in err
    assert "Traceback" not in err and not out.exists()


def test_evaluate_refuses_an_n_its_instances_do_not_have(tmp_path, capsys):
    from real_models import wordnet_benchmark

    bench = wordnet_benchmark("capitals", 12, 3, 0, tmp_path / "bench")
    argv = ["evaluate", "--adapter", "synthetic", "--benchmark", str(bench),
            "--calibration-count", "4", "-N", "4", "--count", "4", "--orders", "2"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "N = 4 was asked for" in err and "have 3 options each; ask for N = 3" in err
    assert main([*argv[:-4], "-N", "3", "--count", "4", "--orders", "2"]) == 0


def test_a_transfer_between_tasks_or_against_task_is_refused(tmp_path, capsys):
    """It ran: calibrated on multiple-choice questions, tested on retrieval, recorded as any
    --task given."""
    from real_models import wordnet_benchmark

    text = [wordnet_benchmark("capitals", 12, 4, s, tmp_path / f"mc{s}") for s in (0, 1)]
    shapes = build_shapes_benchmark(tmp_path / "shapes", count=12, n=4)
    base = ["--adapter", "synthetic", "--count", "4", "--calibration-count", "4",
            "--orders", "2"]  # fmt: skip
    for extra, message in [
        (["--benchmarks", str(text[0]), str(shapes)], "transfer needs benchmarks of one task"),
        (["--benchmarks", *map(str, text), "--task", "pairwise_judge"],
         "--task pairwise_judge, but the benchmarks pose multiple_choice"),
    ]:  # fmt: skip
        out = tmp_path / "study"
        capsys.readouterr()
        assert sweep("transfer", out, *base, *extra) == 2, extra
        assert message in capsys.readouterr().err
        assert not out.exists()
    assert sweep("transfer", tmp_path / "ok", *base, "--benchmarks", *map(str, text)) == 0


def test_settings_a_study_would_ignore_are_refused(tmp_path, capsys):
    """--baseline was recorded and never compared; --calibration-count was replaced by the
    calibration_size study's values, n by the n study's, a benchmark by the transfer study's
    pairs."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"baseline": "pride"}))
    config_n = tmp_path / "n.json"  # the n study's points set N (it was replaced, silently)
    config_n.write_text(json.dumps({"n": 5}))
    base = ["--count", "6", "--orders", "2"]
    for study, extra, message in [
        ("tau", ["--values", "1", "--config", str(config)], "not paired comparisons"),
        ("calibration_size", ["--values", "2,4", "--calibration-count", "6"],
         "drop --calibration-count"),
    ]:  # fmt: skip
        capsys.readouterr()
        assert sweep(study, tmp_path / study, *base, *extra) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / study).exists()
    shapes = build_shapes_benchmark(tmp_path / "shapes", count=12, n=4)
    for study, extra, message in [
        ("n", ["--values", "2,3", "--config", str(config_n)], "sets n of each point"),
        ("transfer", ["--benchmarks", shapes, shapes, "--benchmark", shapes],
         "sets benchmark of each point"),
    ]:  # fmt: skip
        capsys.readouterr()
        assert sweep(study, tmp_path / study, *base, *extra) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        sweep("tau", tmp_path / "flag", *base, "--values", "1", "--baseline", "pride")
    assert stopped.value.code == 2
    assert sweep("calibration_size", tmp_path / "ok", *base, "--values", "2,4") == 0
