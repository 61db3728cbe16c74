"""The lm-eval model plugin in process: registration, calibrated log-likelihoods equal to the
Debiaser's (lm-eval picks the largest), labels, lm-eval's settings, calibration from a task's
recorded split, and refusals that name the task."""

from __future__ import annotations

import json
import re
import tomllib
import traceback
from pathlib import Path

import numpy as np
import pytest
from harness_helpers import page_blocks, require_lm_eval

import posdebias
from posdebias.benchmarks.files import load_benchmark
from posdebias.errors import CalibrationError, ConfigError, InputError
from posdebias.integrations.harness import TaskMappingError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(organism_benchmark):
    """The plugin as lm-eval builds it from `--model_args`, calibrated on 20 of the
    benchmark's 45 items (chosen by seed 0, as `posdebias calibrate` holds them out)."""
    require_lm_eval()
    from lm_eval.api.registry import get_model

    import posdebias.integrations.lm_eval  # noqa: F401  (registers the model)

    cls = get_model("posdebias")
    args = "pretrained=posdebias/organism,calibrators=vanilla+attention_guided"
    args += f",calibration={organism_benchmark}"
    return cls.create_from_arg_string(
        args, {"batch_size": 4, "max_batch_size": None, "device": "cuda:0"}
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


def request(kind: str, arguments: tuple, doc: dict, doc_id: int, task: str = "t"):
    from lm_eval.api.instance import Instance

    return Instance(
        request_type=kind, doc=doc, arguments=arguments, idx=0, metadata=(task, doc_id, 1)
    )


def reference(model) -> posdebias.Debiaser:
    """A Debiaser of our own on the plugin's adapter and the states its rank 0 saved."""
    from posdebias.evaluation.job import load_states

    debiaser = posdebias.Debiaser(model.harness.adapter, ["vanilla", "attention_guided"])
    debiaser.states = load_states(Path(model.provenance["states"]))
    return debiaser


def test_importing_the_module_registers_the_model_and_the_extra_pins_lm_eval(lm_eval_installed):
    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model
    from lm_eval.models import MODEL_MAPPING

    from posdebias.integrations.lm_eval import PosdebiasLM

    assert get_model("posdebias") is PosdebiasLM and issubclass(PosdebiasLM, LM)
    assert "posdebias" not in MODEL_MAPPING  # lm-eval's own list: why `posdebias lm-eval`
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["lm-eval"] == ["lm-eval==0.4.13"]


def test_loglikelihood_is_the_calibrated_log_probability(model, organism_benchmark):
    """One request per (document, label): the calibrated log-probability (not negated: lm-eval
    picks the largest) and whether it is the calibrated choice."""
    docs = docs_of(organism_benchmark)
    requests = [
        request("loglikelihood", ("ctx", f" {label}"), {**doc, "posdebias_calibrator": name}, d)
        for name in ("vanilla", "attention_guided")
        for d, doc in enumerate(docs)
        for label in "1234"
    ]
    pairs = model.loglikelihood(requests)
    debiaser = reference(model)
    for k, name in enumerate(("vanilla", "attention_guided")):
        for d, doc in enumerate(docs):
            rows = pairs[12 * k + 4 * d : 12 * k + 4 * d + 4]
            ranking = debiaser.rank(doc["query"], doc["images"]).of(name)
            assert [ll for ll, _ in rows] == pytest.approx(np.log(ranking.probabilities), abs=1e-6)
            assert int(np.argmax([ll for ll, _ in rows])) == ranking.choice
            assert [greedy for _, greedy in rows].index(True) == ranking.choice


def test_generate_until_answers_the_calibrated_label(model, organism_benchmark):
    docs = [
        {**doc, "posdebias_calibrator": "attention_guided"} for doc in docs_of(organism_benchmark)
    ]
    answers = model.generate_until(
        [request("generate_until", ("ctx", {}), doc, d) for d, doc in enumerate(docs)]
    )
    debiaser = reference(model)
    for doc, answer in zip(docs, answers, strict=True):
        assert answer == str(
            debiaser.rank(doc["query"], doc["images"]).of("attention_guided").choice + 1
        )


def test_lm_eval_settings_apply_where_they_can(model):
    """lm-eval asks every model for cuda:0 by default: on a machine without one, posdebias
    picks its device itself; --batch_size is taken when it is a number."""
    from posdebias.integrations.lm_eval import harness_settings

    assert model.harness.config.batch_size == 4 and str(model.device) == "cpu"
    assert harness_settings({}, {"batch_size": "auto", "device": "cpu"}) == {"device": "cpu"}
    assert harness_settings({"batch_size": 2}, {"batch_size": 8}) == {"batch_size": 2}


def test_refusals_name_the_task(model, organism_benchmark):
    doc = docs_of(organism_benchmark, 1)[0]
    free = {"question": "What is 2+2?", "answer": "4"}
    with pytest.raises(TaskMappingError, match="task 'gsm' cannot be answered"):
        model.generate_until([request("generate_until", ("q", {}), free, 0, "gsm")])
    letters = {**doc, "posdebias_labels": ["A", "B", "C", "D"]}
    with pytest.raises(TaskMappingError, match="task 'letters' expects the labels"):
        model.generate_until([request("generate_until", ("q", {}), letters, 0, "letters")])
    with pytest.raises(TaskMappingError, match="not one of the labels"):
        model.loglikelihood([request("loglikelihood", ("q", " 7"), doc, 0)])
    with pytest.raises(TaskMappingError, match="loglikelihood_rolling"):
        model.loglikelihood_rolling([request("loglikelihood_rolling", ("text",), doc, 0)])
    pride = {**doc, "posdebias_calibrator": "pride"}
    with pytest.raises(ConfigError, match="task 't' scores calibrator 'pride'"):
        model.generate_until([request("generate_until", ("q", {}), pride, 0)])
    arc = {"question": "Which?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}}
    with pytest.raises(TaskMappingError, match="task 'arc'"):
        model.generate_until([request("generate_until", ("q", {}), arc, 0, "arc")])


def test_bad_model_args_are_clear_errors(lm_eval_installed, tmp_path):
    from posdebias.integrations.lm_eval import PosdebiasLM

    with pytest.raises(ConfigError, match="known: pretrained"):
        PosdebiasLM(pretrained="posdebias/organism", temperature=0.5)
    with pytest.raises(ConfigError, match=r"\['attention_guided'\] need a calibration"):
        PosdebiasLM(pretrained="posdebias/organism")
    options = tmp_path / "options.json"
    for text, message in (
        ("[1]", "a JSON object of adapter options"),
        ('{"label_set": "upper"}', r"give \['label_set'\] as harness arguments"),
        ("{", "not valid JSON"),
    ):
        options.write_text(text)
        with pytest.raises(ConfigError, match=message):
            PosdebiasLM(pretrained="posdebias/organism", adapter_options=str(options))
    with pytest.raises(ConfigError, match="adapter options file .* does not exist"):
        PosdebiasLM(pretrained="posdebias/organism", adapter_options=str(tmp_path / "none"))


def test_calibration_task_reads_the_split_the_task_records(organism_benchmark, tmp_path):
    """lm-eval hands a model no other split: a task written by `posdebias lm-eval-task`
    records its calibration file in each document; the model fits on it (the ids written) and
    refuses it once edited."""
    require_lm_eval()
    import datasets

    from posdebias.cli import main
    from posdebias.integrations.lm_eval import PosdebiasLM

    out = tmp_path / "tasks"
    args = ["lm-eval-task", "--benchmark", str(organism_benchmark), "--out", str(out)]
    assert main([*args, "--name", "cal", "--count", "2", "--calibration-count", "5"]) == 0
    module = _module(out / "cal_posdebias.py")
    docs = list(
        module.docs_1(
            datasets.load_dataset("json", data_files=str(out / "cal_items.jsonl"))["train"]
        )
    )
    calibration = out / "cal_calibration.jsonl"
    written = calibration.read_text()
    lm = PosdebiasLM(
        pretrained="posdebias/organism",
        calibrators="attention_guided",
        calibration="task",
        cache_dir=str(tmp_path / "cache"),
    )
    lm.generate_until([request("generate_until", ("q", {}), docs[0], 0, "cal_attention_guided")])
    assert lm.provenance["calibration_ids"] == [
        json.loads(line)["id"] for line in written.splitlines()
    ]
    lines = written.splitlines()
    edited = json.loads(lines[0])
    edited["target"] = (edited["target"] + 1) % 4
    calibration.write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n")
    lm = PosdebiasLM(
        pretrained="posdebias/organism",
        calibrators="attention_guided",
        calibration="task",
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(InputError, match="the calibration file was edited"):
        lm.generate_until(
            [request("generate_until", ("q", {}), docs[0], 0, "cal_attention_guided")]
        )


def _module(path: Path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.mark.parametrize(("count", "seed"), [(5, 0), (7, 3)])
def test_calibration_on_a_benchmark_fits_the_items_posdebias_calibrate_fits(
    organism_benchmark, tmp_path, count, seed
):
    """`calibration=<benchmark>` with M fewer than it holds fits the M items that `posdebias
    calibrate --benchmark --count M --seed S` fits (it took the first M: a second rule)."""
    require_lm_eval()
    from posdebias.cli import main
    from posdebias.core.state import CalibrationState
    from posdebias.integrations.lm_eval import PosdebiasLM

    out = tmp_path / "states"
    args = ["calibrate", "--benchmark", organism_benchmark, "--count", count, "--seed", seed]
    assert main([*map(str, args), "--calibrators", "attention_guided", "--out", str(out)]) == 0
    state = CalibrationState.load(out / "attention_guided.json")
    lm = PosdebiasLM(
        pretrained="posdebias/organism",
        calibrators="attention_guided",
        calibration=str(organism_benchmark),
        calibration_count=count,
        seed=seed,
        cache_dir=str(tmp_path / "cache"),
    )
    lm.harness.calibrate()
    assert lm.provenance["calibration_ids"] == state.calibration_ids
    fitted = lm.harness.debiaser.states_for(state.n)["attention_guided"]
    # the same fit up to float32 rounding (the CLI observes 20 views per forward, the harness 1)
    numbers = ("observed_profile", "bias_matrix", "gamma", "logit_prior", "attention_prior")
    for name in numbers:
        np.testing.assert_allclose(getattr(fitted, name), getattr(state, name), atol=1e-5)
    assert fitted.model_dump(exclude={*numbers, "diagnostics"}) == state.model_dump(
        exclude={*numbers, "diagnostics"}
    )
    first = [item.id for item in load_benchmark(organism_benchmark).instances[:count]]
    assert state.calibration_ids != first  # the seed chose them, not the file order


def test_rotating_an_mmlu_layout_moves_the_choices_and_the_zero_based_answer():
    """lm-eval's MMLU documents: `choices` and an `answer` that is an index from 0; no id (the
    item is named by its position in the task, the same in every rotation)."""
    from posdebias.integrations import lm_eval_tasks as tasks
    from posdebias.integrations.lmms_eval_tasks import rotate_doc

    doc = {"question": "Which?", "subject": "s", "choices": ["w", "x", "y", "z"], "answer": 0}
    rotated = [rotate_doc(doc, r, 7, fields=tasks.LM_EVAL_FIELDS, answer_base=0) for r in range(4)]
    assert [r["choices"][r["answer"]] for r in rotated] == ["w"] * 4
    assert [r["answer"] for r in rotated] == [r["target"] for r in rotated] == [0, 3, 2, 1]
    assert len({r["posdebias_item"] for r in rotated}) == 1
    assert rotated[0]["posdebias_item"] == "item-7"  # no id: its position in the task
    letter = rotate_doc({**doc, "answer": "B"}, 1, 0, fields=tasks.LM_EVAL_FIELDS, answer_base=0)
    assert letter["answer"] == "A" and letter["choices"][0] == "x"
    for bad, message in (({**doc, "answer": 4}, "names no candidate"),
                         ({**doc, "choices": {"text": ["a", "b"]}}, "not a list")):  # fmt: skip
        with pytest.raises(InputError, match=message):
            rotate_doc(bad, 1, 0, fields=tasks.LM_EVAL_FIELDS, answer_base=0)
    # lm-eval picks the largest log-likelihood; lmms-eval the smallest loss
    record = tasks.process_results(
        rotated[1], [(-3.0, False), (-1.0, True), (-2.0, False), (-4.0, False)]
    )
    assert record["acc"]["choice"] == 1 and record["acc"]["chosen"] == 2


@pytest.mark.parametrize("field", ["choices", "options", "texts"])
def test_the_task_functions_read_a_document_as_the_model_does(field):
    """doc_to_text, doc_labels and the model read one document alike: an MMLU document's
    `choices` are text options (doc_to_text took it for retrieval with 0 images)."""
    from posdebias.integrations import lm_eval_tasks as tasks
    from posdebias.integrations.harness import doc_instance
    from posdebias.integrations.lmms_eval_tasks import doc_labels

    doc = {"question": "Which is a fruit?", field: ["rock", "apple", "car"], "answer": 1}
    instance = doc_instance(doc, "t")
    assert instance.task == "multiple_choice" and instance.texts == ("rock", "apple", "car")
    assert doc_labels(doc) == tasks.doc_choices(doc) == ["A", "B", "C"]
    text = tasks.doc_to_text(doc)
    assert "(A to C)" in text and "B. apple" in text and "image" not in text


def test_a_foreign_mmlu_task_rotated_in_lm_eval_equals_posdebias_metrics(tmp_path):
    """An lm-eval task you have (lm-eval's own MMLU template over local questions), rotated by
    `rotated_docs` in its own YAML: the model posdebias (a tiny Llama posing lm-eval's prompt,
    attention_guided calibrated from a saved state) gives lm-eval's table the Acc / RStd /
    Cons. / CircularEval that posdebias computes from the same rankings."""
    require_lm_eval()
    import lm_eval
    from lm_eval.tasks import TaskManager
    from wordnet_mmlu import DESCRIPTION, mmlu_docs, write_mmlu_task

    from posdebias.evaluation.metrics import compute_metrics
    from posdebias.evaluation.states import save_states
    from posdebias.integrations.lm_eval import PosdebiasLM, lm_eval_prompt
    from posdebias.testing import tiny_model_and_processor

    folder = write_mmlu_task(tmp_path / "task", "words", 6)
    # the Harnesses page's YAML, verbatim but for the name of the task it includes
    ((page_yaml,),) = [(b[2],) for b in page_blocks() if b[0] == "lm-eval task"]
    assert "mmlu_anatomy" in page_yaml
    (folder / "words_rotated.yaml").write_text(page_yaml.replace("mmlu_anatomy", "words"))
    adapter = posdebias.get_adapter(
        *tiny_model_and_processor("llama"), **lm_eval_prompt(DESCRIPTION)
    )
    docs = mmlu_docs(11)
    dev = [
        posdebias.Instance(
            stem=d["question"],
            texts=tuple(d["choices"]),
            target=d["answer"],
            id=f"dev{k}",
            task="multiple_choice",
        )
        for k, d in enumerate(docs[6:])
    ]
    fitting = posdebias.Debiaser(adapter, ["attention_guided"])
    fitting.calibrate(dev)
    save_states(fitting.states, tmp_path / "states")
    lm = PosdebiasLM(
        adapter=adapter,
        calibrators="attention_guided+vanilla",
        calibration=str(tmp_path / "states"),
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["words_rotated"],
        task_manager=TaskManager(include_path=str(folder), include_defaults=False),
        num_fewshot=0,
        verbosity="WARNING",
    )
    row = results["results"]["words_rotated"]
    assert lm.provenance["source"] == "saved"
    # posdebias's own numbers from the same rankings of the 6 questions in their 4 rotations
    targets, choices, chosen = np.zeros((6, 4), int), np.zeros((6, 4), int), np.zeros((6, 4), int)
    for i, doc in enumerate(docs[:6]):
        base = posdebias.Instance(
            stem=doc["question"],
            texts=tuple(doc["choices"]),
            target=doc["answer"],
            id=f"q{i}",
            task="multiple_choice",
        )
        for r in range(4):
            view = base.rotated(r)
            choice = next(fitting.rank_many([view])).of("attention_guided").choice
            order = [(k + r) % 4 for k in range(4)]
            targets[i, r], choices[i, r], chosen[i, r] = view.target, choice, order[choice]
    ours = compute_metrics(targets, choices, chosen, 4)
    assert row["acc,none"] == pytest.approx(ours.accuracy_mean)
    assert row["rstd,none"] == pytest.approx(ours.rstd)
    assert row["cons,none"] == pytest.approx(ours.consistency)
    assert row["circular,none"] == pytest.approx(100 * np.mean(np.all(targets == choices, axis=1)))


def test_a_text_task_is_answered_in_its_own_labels_without_a_label_set(tmp_path):
    """The task's own labels whatever the door: without label_set the model answers a
    multiple-choice document in letters, accepting the state `posdebias calibrate` fitted (in
    letters, as the command line poses the task), and a pairwise judgement in A or B."""
    require_lm_eval()
    from posdebias.cli import main
    from posdebias.integrations.lm_eval import PosdebiasLM

    states = tmp_path / "states"
    assert main(["calibrate", "--model", "posdebias/text-organism", "--count", "3",
                 "--calibrators", "pride", "--out", str(states)]) == 0  # fmt: skip
    fitted = PosdebiasLM(
        pretrained="posdebias/text-organism", calibrators="pride", calibration=str(states)
    )
    options = {"id": "m", "question": "Which is a colour?", "texts": ["dog", "red", "car", "sun"]}
    answer = fitted.generate_until([request("generate_until", ("q", {}), options, 0)])[0]
    assert answer in ("A", "B", "C", "D")
    judged = {"id": "j", "question": "Which answer is right?", "texts": ["Paris", "Rome"],
              "task": "pairwise_judge"}  # fmt: skip
    judge = PosdebiasLM(pretrained="posdebias/text-organism", calibrators="vanilla")
    assert judge.generate_until([request("generate_until", ("q", {}), judged, 0)])[0] in ("A", "B")
    # calibrators the saved states do not cover are named together
    said = "holds no state for calibrators 'attention_guided', 'purified_attention' (it holds"
    with pytest.raises(CalibrationError, match=re.escape(said)):
        PosdebiasLM(
            pretrained="posdebias/text-organism",
            calibrators="pride+attention_guided+purified_attention",
            calibration=str(states),
        ).generate_until([request("generate_until", ("q", {}), options, 0)])
    # an unreadable state file is named with them, once (not also as a missing state)
    (states / "attention_guided.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="2 problems with the calibration states") as got:
        PosdebiasLM(
            pretrained="posdebias/text-organism",
            calibrators="pride+attention_guided+purified_attention",
            calibration=str(states),
        ).generate_until([request("generate_until", ("q", {}), options, 0)])
    assert "attention_guided.json is not valid JSON" in str(got.value)
    assert "holds no state for calibrator 'purified_attention' (" in str(got.value)
    assert "\n`posdebias calibrate` writes calibration states." in str(got.value)  # harness words
    assert "Debiaser" not in str(got.value)
    (states / "attention_guided.json").unlink()
    # a label set named is used, and a state fitted in other labels is refused for it
    with pytest.raises(CalibrationError, match=r"its labels are \['A', 'B', 'C', 'D'\], not \['a'"):
        PosdebiasLM(
            pretrained="posdebias/text-organism",
            calibrators="pride",
            calibration=str(states),
            label_set="lower",
        ).generate_until([request("generate_until", ("q", {}), options, 0)])


def test_a_state_of_another_model_is_refused_in_the_harness_words(tmp_path):
    """A harness user is told the model argument that says a calibration transfer is meant
    (calibration_transfer=True), not the Python keyword or the command's flag; with it the
    state answers. The refusal names the state's file (and the row it serves, when its name is
    another's), not the row's key alone."""
    require_lm_eval()
    from posdebias.cli import main
    from posdebias.integrations.lm_eval import PosdebiasLM

    states = tmp_path / "states"
    assert main(["calibrate", "--model", "posdebias/text-organism", "--count", "3",
                 "--calibrators", "pride", "--out", str(states)]) == 0  # fmt: skip
    saved = states / "pride.json"
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "model_id": "someone/else"}))
    options = {"id": "m", "question": "Which is a colour?", "texts": ["dog", "red", "car", "sun"]}
    asked = [request("generate_until", ("q", {}), options, 0)]
    arguments = {"pretrained": "posdebias/text-organism", "calibrators": "pride",
                 "calibration": str(states)}  # fmt: skip
    with pytest.raises(CalibrationError, match="fitted on model 'someone/else'") as refused:
        PosdebiasLM(**arguments).generate_until(asked)
    said = str(refused.value)
    assert said.startswith(f"calibration state {saved} does not fit this use: it was fitted on")
    assert said.endswith("pass calibration_transfer=True in the model arguments.")
    assert "calibration=task" not in said  # VLMEvalKit's model takes no calibration=task
    # the error goes on as it was raised: its traceback reaches the check that refused it
    frames = [frame.name for frame in traceback.extract_tb(refused.value.__traceback__)]
    assert frames[-1] == "check_compatible", frames
    assert "(`posdebias calibrate`, or calibration=<a benchmark folder> in the model" in said
    assert "Debiaser" not in said and "--calibration-transfer" not in said
    answer = PosdebiasLM(**arguments, calibration_transfer=True).generate_until(asked)[0]
    assert answer in ("A", "B", "C", "D")
    saved.rename(states / "mine.json")  # a state of its kind under another name serves the row
    with pytest.raises(CalibrationError) as refused:
        PosdebiasLM(**arguments).generate_until(asked)
    assert str(refused.value).startswith(
        f"calibration state {states / 'mine.json'} (for 'pride') does not fit this use"
    )


def test_the_adapter_model_argument_names_the_adapter_to_load_with(tmp_path):
    """``adapter=NAME`` in lm-eval's --model_args is the adapter posdebias loads ``pretrained``
    with (as for load_adapter); an adapter object given from Python is wrapped."""
    require_lm_eval()
    from posdebias.errors import UnknownNameError
    from posdebias.integrations.lm_eval import PosdebiasLM

    named = "pretrained=posdebias/text-organism,adapter=llama,calibrators=vanilla"
    lm = PosdebiasLM.create_from_arg_string(named, {})
    assert lm.harness.adapter.name == "llama"
    with pytest.raises(UnknownNameError, match="unknown adapter 'nosuch'"):
        PosdebiasLM.create_from_arg_string(named.replace("llama", "nosuch"), {})
    wrapped = PosdebiasLM(adapter=lm.harness.adapter, calibrators="vanilla")
    assert wrapped.harness.adapter is lm.harness.adapter


WORDS = ["dog", "red", "car", "sun", "cup"]


def _colour_questions():
    """Two labelled questions of N = 4 and two of N = 5 ("red" the answer, second)."""
    from posdebias.core.instance import Instance

    return [
        Instance(stem=f"Which is a colour? ({i})", texts=tuple(WORDS[:n]), target=1,
                 id=f"q{n}-{i}", task="multiple_choice")
        for n in (4, 5)
        for i in range(2)
    ]  # fmt: skip


def test_states_saved_for_several_n_answer_documents_of_each_n(tmp_path):
    """A folder `Debiaser.save` wrote for N = 4 and 5 (``pride.n4.json``, ``pride.n5.json``):
    the harness model answers documents of both N (it took the first file for every N)."""
    require_lm_eval()
    from posdebias.integrations.lm_eval import PosdebiasLM

    debiaser = posdebias.Debiaser(posdebias.load_adapter("posdebias/text-organism"), ["pride"])
    debiaser.calibrate(_colour_questions())
    folder = debiaser.save(tmp_path / "states")
    assert sorted(path.name for path in folder.iterdir()) == ["pride.n4.json", "pride.n5.json"]
    lm = PosdebiasLM(
        pretrained="posdebias/text-organism", calibrators="pride", calibration=str(folder)
    )
    for n in (4, 5):
        options = {"id": f"m{n}", "question": "Which is a colour?", "texts": WORDS[:n]}
        answer = lm.generate_until([request("generate_until", ("q", {}), options, 0)])[0]
        assert answer in "ABCDE"[:n]
    assert sorted(lm.harness.debiaser.calibrated_n) == [4, 5]


def test_every_process_of_a_harness_run_holds_each_n_its_first_process_fitted(tmp_path):
    """Rank 0 fits on calibration items of N = 4 and 5 and writes the states for the others;
    rank 1 reads both N (it kept the first N only, so its documents of the other N were
    refused while rank 0 answered them)."""
    from posdebias.core.instance import Instance
    from posdebias.integrations.harness import HarnessConfig, HarnessDebiaser

    items = _colour_questions()
    config = HarnessConfig(
        pretrained="posdebias/text-organism",
        calibrators=["pride", "vanilla"],
        calibration="task",
        cache_dir=str(tmp_path / "cache"),
    )
    adapter = posdebias.load_adapter("posdebias/text-organism")
    ranks = [HarnessDebiaser(config, rank=r, world_size=2, adapter=adapter) for r in (0, 1)]
    for harness in ranks:  # rank 0 first: the others read what it wrote
        harness.calibrate(lambda: items)
    first, second = (harness.debiaser for harness in ranks)
    assert first.calibrated_n == second.calibrated_n == [4, 5]
    for n in (4, 5):
        assert second.states_for(n)["pride"] == first.states_for(n)["pride"]
        query = Instance(stem="Which is red?", texts=tuple(WORDS[:n]), id=f"r{n}",
                         task="multiple_choice")  # fmt: skip
        (one,), (other,) = (harness.answers([query]) for harness in ranks)
        assert one.of("pride").scores.tolist() == other.of("pride").scores.tolist()
