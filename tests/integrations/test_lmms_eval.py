"""The lmms-eval model plugin in process: discovery, the four lmms-eval 0.7.3 workarounds,
answers equal to the Debiaser's, and refusals that name the task."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import numpy as np
import pytest
from harness_helpers import require_lmms_eval, write_task_module

import posdebias
from posdebias.errors import ConfigError, InputError
from posdebias.integrations.harness import TaskMappingError
from posdebias.integrations.lmms_eval_tasks import rotate_doc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(organism_benchmark):
    """The plugin as lmms-eval builds it (``create_from_arg_string``), calibrated on the
    benchmark's first 5 items."""
    require_lmms_eval()
    from lmms_eval.models import get_model

    cls = get_model("posdebias")
    args = "pretrained=posdebias/organism,calibrators=vanilla+attention_guided"
    args += f",calibration={organism_benchmark}"
    return cls.create_from_arg_string(
        args, {"batch_size": 4, "max_batch_size": None, "device": None}
    )


def docs_of(benchmark: Path, count: int = 3) -> list[dict]:
    from posdebias.benchmarks.files import load_benchmark

    items = load_benchmark(benchmark).instances[5 : 5 + count]
    return [
        {
            "id": item.id,
            "query": item.stem,
            "images": [str(image) for image in item.images],
            "target": item.target,
        }
        for item in items
    ]


def reference(model) -> posdebias.Debiaser:
    """A Debiaser of our own on the plugin's adapter and the states its rank 0 saved."""
    from posdebias.evaluation.job import load_states

    debiaser = posdebias.Debiaser(model.harness.adapter, ["vanilla", "attention_guided"])
    debiaser.states = load_states(Path(model.provenance["states"]))
    return debiaser


def request(kind: str, arguments: tuple, doc_id: int, task: str = "t"):
    from lmms_eval.api.instance import Instance

    return Instance(
        request_type=kind,
        arguments=arguments,
        idx=0,
        metadata={"task": task, "doc_id": doc_id, "repeats": 1},
    )


def test_entry_point_makes_posdebias_an_lmms_eval_model(lmms_eval_installed):
    """lmms-eval 0.7.3 builds its registry from the `lmms_eval.models` entry point group."""
    from lmms_eval.api.model import lmms
    from lmms_eval.models import get_model, list_available_models

    from posdebias.integrations.lmms_eval import PosdebiasLMM

    assert "posdebias" in list_available_models()
    assert get_model("posdebias") is PosdebiasLMM and issubclass(PosdebiasLMM, lmms)
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["lmms_eval.models"]["posdebias"] == (
        "posdebias.integrations:lmms_eval_manifest"
    )


def test_workaround_filelock_below_4(lmms_eval_installed):
    """lmms-eval imports filelock's private `filelock._api` (removed in filelock 4): the extra
    pins filelock<4, and lmms-eval's own lock patch then runs."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["lmms-eval"]
    assert "filelock<4" in extra and "lmms-eval==0.7.3" in extra
    assert int(importlib.metadata.version("filelock").split(".")[0]) < 4
    from lmms_eval.evaluator import _enable_reentrant_filelocks

    _enable_reentrant_filelocks()  # imports filelock._api


def test_workarounds_generation_result_and_negated_score(model, organism_benchmark):
    """loglikelihood returns GenerationResult (a bare tuple is stringified by lmms-eval's
    output unwrapping) holding the NEGATED calibrated log-probability (its multiple-choice
    scoring takes the argmin), so the harness picks the calibrated choice."""
    from lmms_eval.api.instance import GenerationResult, unwrap_generation_output

    assert unwrap_generation_output((-1.25, True))[0] == "(-1.25, True)"  # why the wrapper
    docs = docs_of(organism_benchmark)
    model.task_dict = {"t": {"test": docs}}
    labels = ["1", "2", "3", "4"]
    requests = [
        request("loglikelihood", ("ctx", f" {label}", None, d, "t", "test"), d)
        for d in range(len(docs))
        for label in labels
    ]
    results = model.loglikelihood(requests)
    assert all(isinstance(result, GenerationResult) for result in results)
    pairs = [unwrap_generation_output(result)[0] for result in results]
    debiaser = reference(model)
    for d, doc in enumerate(docs):
        losses = [pairs[4 * d + k][0] for k in range(4)]
        greedy = [pairs[4 * d + k][1] for k in range(4)]
        ranking = debiaser.rank(doc["query"], doc["images"]).of("vanilla")
        assert losses == pytest.approx(-np.log(ranking.probabilities), abs=1e-6)
        assert int(np.argmin(losses)) == ranking.choice and greedy.index(True) == ranking.choice
        assert min(losses) > 0  # a loss: the negative log-likelihood


def test_generate_until_answers_the_calibrated_label(model, organism_benchmark):
    docs = docs_of(organism_benchmark)
    rotated = [{**rotate_doc(doc, 1), "posdebias_calibrator": "attention_guided"} for doc in docs]
    model.task_dict = {"t": {"test": rotated}}
    answers = model.generate_until(
        [request("generate_until", ("ctx", {}, None, d, "t", "test"), d) for d in range(3)]
    )
    debiaser = reference(model)
    for doc, answer in zip(rotated, answers, strict=True):
        ranking = debiaser.rank(doc["query"], doc["images"]).of("attention_guided")
        assert answer.text == str(ranking.choice + 1)


def test_workaround_accelerator_and_device_attributes(model):
    """lmms-eval's multi-process path calls lm.accelerator.gather(tensor on lm.device)."""
    import torch
    from accelerate import Accelerator

    assert isinstance(model.accelerator, Accelerator)
    assert isinstance(model.device, torch.device)
    gathered = model.accelerator.gather(torch.tensor(3, device=model.device))
    assert gathered.tolist() in (3, [3])
    assert model.rank == 0 and model.world_size == 1


def test_refuses_a_task_it_cannot_map_naming_it(model):
    model.task_dict = {"mmmu_val": {"test": [{"question": "What is 2+2?", "answer": "4"}]}}
    with pytest.raises(TaskMappingError, match="task 'mmmu_val' cannot be answered"):
        model.generate_until(
            [request("generate_until", ("q", {}, None, 0, "mmmu_val", "test"), 0, "mmmu_val")]
        )
    bad = {"question": "Which?", "options": ["a", "b"], "answer": "E"}
    model.task_dict = {"muirbench": {"test": [bad]}}
    with pytest.raises(TaskMappingError, match="task 'muirbench'.*answer 'E' names none"):
        model.generate_until(
            [request("generate_until", ("q", {}, None, 0, "muirbench", "test"), 0, "muirbench")]
        )


def test_refuses_labels_the_task_does_not_expect(model, organism_benchmark):
    doc = {**docs_of(organism_benchmark, 1)[0], "posdebias_labels": ["A", "B", "C", "D"]}
    model.task_dict = {"letters": {"test": [doc]}}
    with pytest.raises(TaskMappingError, match="task 'letters' expects the labels"):
        model.generate_until([request("generate_until", ("q", {}, None, 0, "letters", "test"), 0)])
    plain = docs_of(organism_benchmark, 1)[0]
    model.task_dict = {"t": {"test": [plain]}}
    with pytest.raises(TaskMappingError, match="not one of the labels"):
        model.loglikelihood([request("loglikelihood", ("q", " E", None, 0, "t", "test"), 0)])


def test_refuses_a_calibrator_row_the_model_does_not_run(model, organism_benchmark):
    doc = {**docs_of(organism_benchmark, 1)[0], "posdebias_calibrator": "pride"}
    model.task_dict = {"t_pride": {"test": [doc]}}
    with pytest.raises(ConfigError, match="task 't_pride' scores calibrator 'pride'"):
        model.generate_until([request("generate_until", ("q", {}, None, 0, "t_pride", "test"), 0)])


def test_bad_model_args_are_clear_errors(lmms_eval_installed, organism_benchmark):
    from posdebias.integrations.lmms_eval import PosdebiasLMM

    with pytest.raises(ConfigError, match="known: pretrained"):
        PosdebiasLMM(pretrained="posdebias/organism", temperature=0.5)
    with pytest.raises(ConfigError, match=r"\['attention_guided'\] need a calibration"):
        PosdebiasLMM(pretrained="posdebias/organism")
    with pytest.raises(InputError, match="unknown calibrator"):
        PosdebiasLMM(pretrained="posdebias/organism", calibrators="nope")
    with pytest.raises(ConfigError, match="neither a saved calibration state"):
        lm = PosdebiasLMM(pretrained="posdebias/organism", calibration="/no/such/path")
        lm.harness.calibrate()


def test_calibration_from_a_saved_state_with_its_provenance(organism_benchmark, tmp_path):
    """calibration=<what `posdebias calibrate` saved>: loaded (checked against this model),
    its path and file hashes recorded; a state for another model is refused unless
    calibration_transfer says the transfer is intended."""
    require_lmms_eval()
    import hashlib
    import json

    from posdebias.cli import main
    from posdebias.errors import CalibrationError
    from posdebias.integrations.lmms_eval import PosdebiasLMM

    states = tmp_path / "states"
    args = ["calibrate", "--benchmark", str(organism_benchmark), "--count", "3"]
    assert main([*args, "--calibrators", "attention_guided", "--out", str(states)]) == 0
    lm = PosdebiasLMM(
        pretrained="posdebias/organism",
        calibrators="attention_guided+vanilla",
        calibration=str(states),
    )
    lm.harness.calibrate()
    saved = states / "attention_guided.json"
    assert lm.provenance["source"] == "saved" and lm.provenance["path"] == str(states.resolve())
    assert lm.provenance["sha256"] == {saved.name: hashlib.sha256(saved.read_bytes()).hexdigest()}
    assert lm.harness.debiaser.states["attention_guided"] == posdebias.CalibrationState.load(saved)

    other = json.loads(saved.read_text())
    other["model_id"] = "someone/else"
    (tmp_path / "other.json").write_text(json.dumps(other))
    lm = PosdebiasLMM(pretrained="posdebias/organism", calibration=str(tmp_path / "other.json"))
    with pytest.raises(CalibrationError, match="fitted on model 'someone/else'"):
        lm.harness.calibrate()
    lm = PosdebiasLMM(
        pretrained="posdebias/organism",
        calibration=str(tmp_path / "other.json"),
        calibration_transfer=True,
    )
    lm.harness.calibrate()
    assert lm.provenance["transfer"] is True and lm.provenance["model_id"] == "someone/else"


def test_a_calibration_split_edited_after_the_tasks_were_written_is_refused(
    model, organism_benchmark, tmp_path
):
    """The written module records a digest of the calibration split beside the items' own;
    each rotated document carries it, and the model refuses the split (as lmms-eval loads it:
    the json dataset loader) once its ids, candidates or truths changed."""
    import json

    import datasets

    out = tmp_path / "tasks"
    module = write_task_module(
        organism_benchmark, out, "cal", "--count", "4", "--calibration-count", "5"
    )
    calibration = out / "cal_calibration.jsonl"
    written = calibration.read_text()

    def task_dict():
        files = {"test": str(out / "cal_items.jsonl"), "calibration": str(calibration)}
        loaded = datasets.load_dataset("json", data_files=files)
        return {"cal_vanilla": {**loaded, "test": module.docs_0(loaded["test"])}}

    model.task_dict = task_dict()
    assert [item.id for item in model._task_items(["cal_vanilla"])] == [
        json.loads(line)["id"] for line in written.splitlines()
    ]
    lines = written.splitlines()
    for field, change in (
        ("target", lambda doc: (doc["target"] + 1) % 4),
        ("images", lambda doc: doc["images"][::-1]),
        ("id", lambda doc: doc["id"] + "x"),
    ):
        doc = json.loads(lines[1])
        doc[field] = change(doc)
        calibration.write_text("\n".join([lines[0], json.dumps(doc), *lines[2:]]) + "\n")
        model.task_dict = task_dict()
        with pytest.raises(InputError, match="the calibration file was edited"):
            model._task_items(["cal_vanilla"])
    calibration.write_text(written)
    model.task_dict = task_dict()
    assert len(model._task_items(["cal_vanilla"])) == 5
