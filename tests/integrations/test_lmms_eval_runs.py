"""lmms-eval runs end to end, offline: rotated local tasks, the bundled organism, a tiny
Qwen2.5-VL, one process and two (accelerate on CPU), compared with posdebias's own evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_helpers import CALIBRATORS, GROUPS, ORGANISM_ARGS, require_lmms_eval, run_lmms_eval

from posdebias.cli import main
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.job import run_evaluation


@pytest.fixture(scope="module")
def rotated_tasks(organism_benchmark, tmp_path_factory) -> Path:
    """The 40 test items in 4 rotations, as a generated-answer and a multiple-choice group,
    written by the documented command (5 items held out as each task's calibration split)."""
    require_lmms_eval()
    folder = tmp_path_factory.mktemp("tasks")
    for name, output_type in GROUPS.items():
        args = ["lmms-eval-task", "--benchmark", str(organism_benchmark), "--out", str(folder)]
        args += ["--name", name, "--output-type", output_type, "--count", "40"]
        args += ["--calibration-count", "5", "--calibrators", ",".join(CALIBRATORS)]
        assert main(args) == 0
    return folder


@pytest.fixture(scope="module")
def one_process(rotated_tasks, tmp_path_factory) -> dict:
    return run_lmms_eval(
        tmp_path_factory.mktemp("run-1"), ORGANISM_ARGS, ",".join(GROUPS), rotated_tasks
    )


def test_lmms_eval_table_equals_posdebias_evaluate_exactly(one_process, own_evaluate):
    """Done means: inside lmms-eval's table, the vanilla and attention_guided rows of the
    40-item task rotated 4 ways have posdebias evaluate's Acc / RStd / Cons. exactly, through
    both the generated-answer and the log-likelihood path."""
    assert own_evaluate.num_instances == 40 and own_evaluate.orders == 4
    table = one_process["results"]
    for group in GROUPS:
        for label in CALIBRATORS:
            row = table[f"{group}_{label}"]
            ours = own_evaluate.calibrators[label].metrics
            assert row["acc,none"] == ours.accuracy_mean, (group, label)
            assert row["rstd,none"] == ours.rstd, (group, label)
            assert row["cons,none"] == ours.consistency, (group, label)
    vanilla, guided = (own_evaluate.calibrators[label].metrics for label in CALIBRATORS)
    assert vanilla.rstd > guided.rstd and vanilla.accuracy_mean < guided.accuracy_mean
    assert "shapes_gen_attention_guided" in one_process["stdout"]  # rows of the printed table


def test_circular_eval_counts_items_right_in_every_rotation(one_process):
    for group in GROUPS:
        for label in CALIBRATORS:
            task = f"{group}_{label}"
            records = [sample["circular"] for sample in one_process["samples_by_task"][task]]
            by_item: dict[str, list[bool]] = {}
            for record in records:
                by_item.setdefault(record["item"], []).append(record["choice"] == record["target"])
            assert len(by_item) == 40 and all(len(v) == 4 for v in by_item.values())
            expected = 100.0 * sum(all(v) for v in by_item.values()) / 40
            assert one_process["results"][task]["circular,none"] == expected


def test_rotations_and_calibration_recorded_in_the_harness_output(one_process, own_evaluate):
    samples = one_process["samples_by_task"]["shapes_gen_attention_guided"]
    assert len(samples) == 160
    rotations = sorted((s["acc"]["item"], s["acc"]["rotation"]) for s in samples)
    assert rotations == sorted({(item, r) for item, _ in rotations for r in range(4)})
    for sample in samples:
        calibration = sample["acc"]["calibration"]
        assert calibration["source"] == "task" and calibration["split"] == "calibration"
        assert calibration["calibration_ids"] == own_evaluate.calibration_ids
        assert sample["acc"]["calibrator"] == "attention_guided"
        # the generated answer is the label of the chosen position, as the task expects
        assert sample["filtered_resps"] == str(sample["acc"]["choice"] + 1)


def test_two_processes_equal_one_process(rotated_tasks, one_process, tmp_path_factory):
    """`accelerate launch --num_processes 2` (CPU): rank 0 calibrates, rank 1 waits and reads
    the same states; every number and every answer equals the one-process run."""
    two = run_lmms_eval(
        tmp_path_factory.mktemp("run-2"),
        ORGANISM_ARGS,
        ",".join(GROUPS),
        rotated_tasks,
        processes=2,
    )
    assert two["config"]["model_args"] == one_process["config"]["model_args"]
    for task, row in one_process["results"].items():
        for metric in ("acc,none", "rstd,none", "cons,none", "circular,none"):
            if metric in row:
                assert two["results"][task][metric] == row[metric], (task, metric)
    for task, samples in one_process["samples_by_task"].items():
        answers = {s["doc_id"]: (s["filtered_resps"], s["acc"]["choice"]) for s in samples}
        other = {
            s["doc_id"]: (s["filtered_resps"], s["acc"]["choice"])
            for s in two["samples_by_task"][task]
        }
        assert other == answers, task
        shared = {s["acc"]["calibration"]["states"] for s in two["samples_by_task"][task]}
        assert len(shared) == 1  # both ranks used the one calibration rank 0 wrote


TEXT_GROUPS = {"textmcq_gen": "generate_until", "textmcq_mc": "multiple_choice"}
TEXT_WORDS = ("red", "green", "blue", "dog", "cat", "horse", "apple", "pear", "plum", "car", "bus")


@pytest.fixture(scope="module")
def text_mcq(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A text-option multiple-choice benchmark (15 questions, no image anywhere, 4 options
    each: 3 held out, 12 tested), a tiny Qwen2.5-VL saved to a folder, and the rotated task
    groups written by the documented command."""
    require_lmms_eval()
    from posdebias.testing import save_tiny_model

    folder = tmp_path_factory.mktemp("text-mcq")
    rows = [
        {"id": f"q{k}", "question": f"Which word is number {k}?", "answer": "ABCD"[k % 4],
         "options": [TEXT_WORDS[(k + j) % len(TEXT_WORDS)] for j in range(4)]}
        for k in range(15)
    ]  # fmt: skip
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = folder / "bench"
    assert main(["build", "--source", "mcq", "--data", str(data), "--out", str(bench)]) == 0
    model = save_tiny_model("qwen2_5_vl", folder / "model")
    tasks = folder / "tasks"
    for name, output_type in TEXT_GROUPS.items():
        args = ["lmms-eval-task", "--benchmark", str(bench), "--out", str(tasks), "--name", name]
        args += ["--output-type", output_type, "--count", "12", "--calibration-count", "3"]
        args += ["--calibrators", ",".join(CALIBRATORS)]
        assert main(args) == 0
    return bench, model, tasks


def test_a_text_option_task_on_a_tiny_qwen2_5_vl_equals_posdebias_evaluate(
    text_mcq, tmp_path_factory
):
    """Done means: a text-option multiple-choice task (no image in any prompt) runs the same
    way on a vision-language model: lmms-eval's vanilla and attention_guided rows equal
    posdebias evaluate's on the same 12 items in the same 4 cyclic orders, through the
    generated-answer and the log-likelihood path."""
    bench, model, tasks = text_mcq
    model_args = f"pretrained={model},calibrators=vanilla+attention_guided,calibration=task"
    run = run_lmms_eval(
        tmp_path_factory.mktemp("run-text"),
        model_args + ",label_set=upper",
        ",".join(TEXT_GROUPS),
        tasks,
    )
    ours = run_evaluation(
        EvaluateConfig(
            model=str(model),
            benchmark=bench,
            task="multiple_choice",
            count=12,
            calibration_count=3,
            orders=4,
            order_kind="cyclic",
            seed=0,
            calibrators=list(CALIBRATORS),
        )
    )
    assert ours.num_instances == 12 and ours.orders == 4
    for group in TEXT_GROUPS:
        for label in CALIBRATORS:
            row = run["results"][f"{group}_{label}"]
            metrics = ours.calibrators[label].metrics
            assert row["acc,none"] == metrics.accuracy_mean, (group, label)
            assert row["rstd,none"] == metrics.rstd, (group, label)
            assert row["cons,none"] == metrics.consistency, (group, label)
    samples = run["samples_by_task"]["textmcq_gen_attention_guided"]
    assert len(samples) == 48
    assert {sample["filtered_resps"] for sample in samples} <= {"A", "B", "C", "D"}
    assert samples[0]["acc"]["calibration"]["calibration_ids"] == ours.calibration_ids
