"""lm-eval runs end to end, offline: `posdebias lm-eval` (lm-eval's own command line with the
model posdebias) on rotated local tasks and the bundled organism, compared with posdebias's own
evaluate on the same items and orders."""

from __future__ import annotations

import pytest
from harness_helpers import CALIBRATORS, GROUPS, ORGANISM_ARGS, require_lm_eval, run_lm_eval

from posdebias.cli import main


@pytest.fixture(scope="module")
def rotated_tasks(organism_benchmark, tmp_path_factory):
    """The 40 test items in 4 rotations, as a generated-answer and a multiple-choice group,
    written by `posdebias lm-eval-task` (5 items held out as each task's calibration split)."""
    require_lm_eval()
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, output_type in GROUPS.items():
        args = ["lm-eval-task", "--benchmark", str(organism_benchmark), "--out", str(folder)]
        args += ["--name", name, "--output-type", output_type, "--count", "40"]
        args += ["--calibration-count", "5", "--calibrators", ",".join(CALIBRATORS)]
        assert main(args) == 0
    return folder


@pytest.fixture(scope="module")
def one_run(rotated_tasks, tmp_path_factory) -> dict:
    return run_lm_eval(
        tmp_path_factory.mktemp("lm-eval-run"), ORGANISM_ARGS, ",".join(GROUPS), rotated_tasks
    )


def test_lm_eval_table_equals_posdebias_evaluate_exactly(one_run, own_evaluate):
    """Inside lm-eval's results, the vanilla and attention_guided rows of the 40 items rotated
    4 ways have posdebias evaluate's Acc / RStd / Cons. exactly, through the log-likelihood
    path (lm-eval picks the largest calibrated log-probability) and the generated label."""
    table = one_run["results"]
    for group in GROUPS:
        for label in CALIBRATORS:
            row = table[f"{group}_{label}"]
            ours = own_evaluate.calibrators[label].metrics
            assert row["acc,none"] == ours.accuracy_mean, (group, label)
            assert row["rstd,none"] == ours.rstd, (group, label)
            assert row["cons,none"] == ours.consistency, (group, label)
    vanilla, guided = (own_evaluate.calibrators[label].metrics for label in CALIBRATORS)
    assert vanilla.rstd > guided.rstd and vanilla.accuracy_mean < guided.accuracy_mean


def test_the_printed_table_has_the_four_rows_of_every_calibrator(one_run):
    """Done means: lm-eval with posdebias prints Acc / RStd / Cons. / CircularEval rows."""
    printed = one_run["stdout"]
    for group in GROUPS:
        for label in CALIBRATORS:
            assert f"{group}_{label}" in printed
    rows = [line for line in printed.splitlines() if line.startswith("|")]
    for metric in ("acc", "rstd", "cons", "circular"):
        assert sum(f"|{metric}" in line.replace(" ", "") for line in rows) == 4, metric


def test_circular_eval_and_the_records_of_every_rotation(one_run, own_evaluate):
    for group in GROUPS:
        for label in CALIBRATORS:
            task = f"{group}_{label}"
            samples = one_run["samples_by_task"][task]
            assert len(samples) == 160
            by_item: dict[str, list[bool]] = {}
            for sample in samples:
                record = sample["circular"]
                assert record["calibrator"] == label
                assert record["calibration"]["source"] == "task"
                assert record["calibration"]["calibration_ids"] == own_evaluate.calibration_ids
                by_item.setdefault(record["item"], []).append(record["choice"] == record["target"])
            assert len(by_item) == 40 and all(len(v) == 4 for v in by_item.values())
            expected = 100.0 * sum(all(v) for v in by_item.values()) / 40
            assert one_run["results"][task]["circular,none"] == expected


def test_two_processes_equal_one_process(rotated_tasks, one_run, tmp_path_factory):
    """`accelerate launch --num_processes 2 -m posdebias lm-eval` (CPU): rank 0 calibrates and
    writes, rank 1 waits and reads the same states; every number equals the one-process run."""
    two = run_lm_eval(
        tmp_path_factory.mktemp("lm-eval-run-2"),
        ORGANISM_ARGS,
        ",".join(GROUPS),
        rotated_tasks,
        processes=2,
    )
    for task, row in one_run["results"].items():
        for metric in ("acc,none", "rstd,none", "cons,none", "circular,none"):
            if metric in row:
                assert two["results"][task][metric] == row[metric], (task, metric)
    samples = two["samples_by_task"]["shapes_mc_attention_guided"]
    assert len(samples) == 160
    assert {s["acc"]["calibration"]["shared_by_rank"] for s in samples} == {0}
