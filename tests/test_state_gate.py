"""One state gate and one set of defaults per task, whatever the door: a calibration state made
by `Debiaser.calibrate` or `posdebias calibrate` is accepted by the other doors for the same use
(and still refused for another), and the library prompts a task with the labels the command line
uses. On the bundled text model (a real tiny Llama)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from posdebias import Debiaser
from posdebias.benchmarks.files import load_benchmark
from posdebias.cli import main
from posdebias.errors import CalibrationError
from posdebias.loading import default_label_set, load_adapter
from posdebias.registry import get_registry


@pytest.fixture(scope="module")
def organism():
    bundled = get_registry().default_model("multiple_choice")
    assert bundled is not None and bundled.task == "multiple_choice"
    return bundled


@pytest.fixture(scope="module")
def adapter(organism):
    return load_adapter(organism.name)  # no label set named: the task's, as on the CLI


@pytest.fixture(scope="module")
def questions(organism):
    return load_benchmark(organism.benchmark(4)).instances


def test_every_door_prompts_a_task_with_the_same_labels(adapter):
    assert default_label_set("multiple_choice") == default_label_set("pairwise_judge") == "upper"
    assert default_label_set("retrieval") == default_label_set("rerank") == "digits"
    assert default_label_set(None, "posdebias/text-organism") == "upper"  # its own task
    assert adapter.labels_for(4) == ["A", "B", "C", "D"]


def test_the_bundled_text_model_ranks_through_the_api_without_a_label_set(adapter, questions):
    ranking = Debiaser(adapter, "vanilla").rank(questions[0].stem, texts=questions[0].texts)
    assert ranking.best_text in questions[0].texts


def test_a_state_fitted_by_the_api_is_accepted_by_evaluate(tmp_path, adapter, questions, capsys):
    debiaser = Debiaser(adapter, "pride")
    debiaser.calibrate(questions[:3])
    state = debiaser.save(tmp_path / "pride.json")
    argv = ["evaluate", "--task", "multiple_choice", "--calibrators", "pride", "--count", "6",
            "--orders", "2", "--calibration", str(state),
            "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["calibrators"]["pride"]["calibration"]["source"] == "saved"


def test_a_state_fitted_on_another_tasks_prompt_is_still_refused(tmp_path, adapter, questions):
    reranked = [replace(question, task="rerank") for question in questions[:3]]
    debiaser = Debiaser(adapter, "pride")
    debiaser.calibrate(reranked)
    state = debiaser.save(tmp_path / "pride.json")
    argv = ["evaluate", "--task", "multiple_choice", "--calibrators", "pride", "--count", "4",
            "--orders", "2", "--calibration", str(state)]  # fmt: skip
    assert main(argv) == 2
    loaded = Debiaser.load(state, adapter)
    posed = loaded.rank(reranked[0].stem, texts=reranked[0].texts, task="rerank")
    assert posed.best_text
    # a query that names no task is posed as the one its state was fitted on
    unnamed = loaded.rank(reranked[0].stem, texts=reranked[0].texts)
    assert unnamed.probabilities.tolist() == posed.probabilities.tolist()
    with pytest.raises(CalibrationError, match="fitted on rerank queries, and this one is posed"):
        loaded.rank(questions[0].stem, texts=questions[0].texts, task="multiple_choice")


def test_a_state_made_by_posdebias_calibrate_is_accepted_by_debiaser_load(
    tmp_path, adapter, questions
):
    config = tmp_path / "config.yaml"
    config.write_text("task: multiple_choice\ncalibrators: [pride, vanilla]\n")
    assert main(["calibrate", "--config", str(config), "--count", "3", "--out",
                 str(tmp_path / "states")]) == 0  # fmt: skip
    debiaser = Debiaser.load(tmp_path / "states", adapter)
    assert set(debiaser.states) == {"pride", "vanilla"}
    ranking = debiaser.rank(questions[0].stem, texts=questions[0].texts)
    assert ranking.best_text in questions[0].texts
    # another model's state is refused unless the transfer is meant, at this door too
    other = json.loads((tmp_path / "states" / "pride.json").read_text())
    other["model_id"] = "someone/else"
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(CalibrationError, match="someone/else"):
        Debiaser.load(tmp_path / "other.json", adapter)
    assert Debiaser.load(tmp_path / "other.json", adapter, transfer=True).states
