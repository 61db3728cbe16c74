"""One state gate and one set of defaults per task, whatever the door: a calibration state made
by `Debiaser.calibrate` or `posdebias calibrate` is accepted by the other doors for the same use
(and still refused for another), and the library prompts a task with the labels the command line
uses. On the bundled text model (a real tiny Llama)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace

import pytest

from posdebias import Debiaser
from posdebias.benchmarks.files import load_benchmark
from posdebias.cli import main
from posdebias.errors import CalibrationError, CalibrationErrors, InputError
from posdebias.evaluation.config import config_from_data
from posdebias.evaluation.job import build_adapter
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
    assert default_label_set("rerank", "posdebias/text-organism") == "upper"  # its own words
    with pytest.raises(InputError, match="unknown task 'bogus'"):
        default_label_set("bogus", "posdebias/text-organism")
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


#: prompt settings a state can be fitted with: the model's own chat template, none (the raw
#: prompt), one written for the occasion (Jinja), an answer prefix, scores after the
#: checkpoint's generation config
PROMPT_SETTINGS = {
    "own": {},
    "raw": {"chat_template": "raw"},
    "jinja": {
        "chat_template": "{% for m in messages %}USER SAYS: {{ m['content'] }}\n{% endfor %}"
    },
    "prefix": {"answer_prefix": "Answer: "},
    "processed": {"logits_processors": "generation_config"},
}


@pytest.fixture(scope="module")
def fitted_per_setting(organism, questions, tmp_path_factory):
    """A pride state fitted through the API under each prompt setting, and the adapters."""
    folder = tmp_path_factory.mktemp("settings")
    adapters, states = {}, {}
    for name, options in PROMPT_SETTINGS.items():
        adapters[name] = load_adapter(organism.name, **options)
        debiaser = Debiaser(adapters[name], "pride")
        debiaser.calibrate(questions[:3])
        states[name] = debiaser.save(folder / f"{name}.json")
    return adapters, states


def test_a_state_is_used_only_with_the_prompt_settings_it_was_fitted_with(
    fitted_per_setting, adapter, tmp_path, capsys
):
    """A chat template, an answer prefix or processed logits change what the model reads or
    how it is scored: a state fitted under one setting is refused under another at every door
    (the API, `evaluate`), accepted under its own; a state fitted with the defaults keeps the
    prompt hash it had before these settings were hashed (its task template's digest)."""
    adapters, states = fitted_per_setting
    hashes = {name: json.loads(path.read_text())["prompt_hash"] for name, path in states.items()}
    assert len(set(hashes.values())) == len(PROMPT_SETTINGS)
    assert hashes["own"] == adapter.task_templates["multiple_choice"].digest()
    for fitted, path in states.items():
        for used, used_adapter in adapters.items():
            if used == fitted:
                assert Debiaser.load(path, used_adapter).states
                continue
            with pytest.raises(CalibrationError, match="fitted with another prompt"):
                Debiaser.load(path, used_adapter)
    config = tmp_path / "raw.yaml"
    config.write_text("task: multiple_choice\nadapter: {options: {chat_template: raw}}\n")
    argv = ["evaluate", "--config", str(config), "--calibrators", "pride", "--count", "3",
            "--orders", "1", "--calibration"]  # fmt: skip
    capsys.readouterr()
    assert main([*argv, str(states["own"]), "--out", str(tmp_path / "refused")]) == 2
    assert "chat template or prompt options" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    assert main([*argv, str(states["raw"]), "--out", str(tmp_path / "run")]) == 0


#: a calibrator (a row of a config), a field its predictions read, and how a state loses it
INCOMPLETE = [
    ("pride", "logit_prior", "null"),
    ("batch", "logit_prior", "deleted"),
    ("contextual", "logit_prior", "null"),
    ("attention_guided", "bias_matrix", "null"),
    ("attention_guided", "attention_prior", "deleted"),
    ("attention_guided", "layer_choice", "null"),
    ("purified_attention", "layer_choice", "deleted"),
    ("attention_readout", "layer_choice", "null"),
    ("label_free", "bias_matrix", "deleted"),
]
#: PriDe's test workflow, whose state holds own parameters (the estimation items)
TESTED_PRIDE = "{name: pride, label: tested, options: {workflow: test, alpha: 0.5}}"


def _calibrated(tmp_path, row: str):
    """The config running calibrator ``row``, and the file `posdebias calibrate` saved."""
    config = tmp_path / "config.yaml"
    config.write_text(f"task: multiple_choice\ncalibrators: [{row}]\n")
    assert main(["calibrate", "--config", str(config), "--count", "3", "--out",
                 str(tmp_path / "states")]) == 0  # fmt: skip
    (state,) = (tmp_path / "states").glob("*.json")
    return config, state


@pytest.mark.parametrize(("row", "field", "how"), INCOMPLETE)
def test_a_state_missing_what_its_calibrator_reads_is_refused_before_any_run(
    row, field, how, tmp_path, capsys
):
    """A hand-edited state without a field its calibrator reads (a fitted array, the layer
    choice) is refused when it is loaded, by the API and by `evaluate`
    (exit 2, no run folder), naming the field and the file; the complete state is accepted."""
    config, state = _calibrated(tmp_path, row)
    saved = json.loads(state.read_text())
    assert saved[field] is not None
    if how == "null":
        saved[field] = None
    else:
        del saved[field]
    cut = tmp_path / "cut" / state.name
    cut.parent.mkdir()
    cut.write_text(json.dumps(saved))
    calibrator = saved["calibrator"]
    said = f"it holds no fitted '{field}', which calibrator '{calibrator}' reads"
    adapter = load_adapter(get_registry().default_model("multiple_choice").name)
    with pytest.raises(CalibrationError) as refused:
        Debiaser.load(cut, adapter)
    assert f"calibration state {cut} does not fit this use: {said}" in str(refused.value)
    assert Debiaser.load(tmp_path / "states", adapter).states
    argv = ["evaluate", "--config", str(config), "--count", "3", "--orders", "1",
            "--calibration"]  # fmt: skip
    capsys.readouterr()
    assert main([*argv, str(cut), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert f"calibration state {cut} does not fit this use: {said}" in err
    if field == "bias_matrix" and calibrator == "attention_guided":  # as docs/errors.md shows
        assert "it holds no fitted 'bias_matrix', which calibrator 'attention_guided' reads" in err
    assert not (tmp_path / "refused").exists()
    assert main([*argv, str(tmp_path / "states"), "--out", str(tmp_path / "run")]) == 0


def test_own_parameters_of_a_state_are_checked_and_another_calibrators_state_named_as_such(
    tmp_path, capsys
):
    """A state's own parameters (PriDe's estimation items) with a key its calibrator does not
    know, or of the wrong type, are refused; a state of another calibrator is refused as that,
    not for lacking what the using calibrator reads."""
    config, state = _calibrated(tmp_path, TESTED_PRIDE)
    saved = json.loads(state.read_text())
    argv = ["evaluate", "--config", str(config), "--count", "3", "--orders", "1",
            "--out", str(tmp_path / "refused"), "--calibration"]  # fmt: skip
    edits = {
        "estimation_id": "its own fitted parameters (extra) hold unknown ['estimation_id']",
        "estimation_ids": "its own fitted parameters (extra): estimation_ids: Input should be",
    }
    for key, said in edits.items():
        edited = tmp_path / key / state.name
        edited.parent.mkdir()
        edited.write_text(json.dumps({**saved, "extra": {**saved["extra"], key: "q1"}}))
        capsys.readouterr()
        assert main([*argv, str(edited)]) == 2
        err = capsys.readouterr().err
        assert said in err and "unknown field" not in err  # an unknown key named once
        assert not (tmp_path / "refused").exists()
    other = tmp_path / "other"
    other.mkdir()
    batch = {**saved, "calibrator": "batch", "options": {}, "extra": {}}
    (other / "attention_guided.json").write_text(json.dumps(batch))
    guided = ["evaluate", "--task", "multiple_choice", "--calibrators", "attention_guided",
              "--count", "3", "--orders", "1", "--calibration", str(other)]  # fmt: skip
    capsys.readouterr()
    assert main(guided) == 2
    err = capsys.readouterr().err
    assert "it was fitted by calibrator 'batch', not 'attention_guided'" in err
    assert "holds no fitted" not in err


def test_a_state_whose_attention_rows_name_no_layers_is_counted_against_the_model(tmp_path, capsys):
    """Layers read by mass (no layer choice) and the state's layer fields deleted: an attention
    prior with fewer rows than the model reads is refused (it was an IndexError after the run
    folder was made); with the right number of rows the state is read as dense layers."""
    row = "{name: purified_attention, options: {layer_selection: mass}}"
    config, state = _calibrated(tmp_path, row)
    saved = json.loads(state.read_text())
    for field in ("num_layers", "layers", "layer_kinds", "layer_choice"):
        saved.pop(field, None)
    argv = ["evaluate", "--config", str(config), "--count", "3", "--orders", "1",
            "--calibration"]  # fmt: skip
    cut = tmp_path / "cut" / state.name
    cut.parent.mkdir()
    cut.write_text(json.dumps({**saved, "attention_prior": saved["attention_prior"][:1]}))
    capsys.readouterr()
    assert main([*argv, str(cut), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    rows = len(saved["attention_prior"])
    assert f"its attention prior has 1 rows, but this model's observations read {rows} (" in err
    assert "internal error" not in err and not (tmp_path / "refused").exists()
    cut.write_text(json.dumps(saved))
    assert main([*argv, str(cut), "--out", str(tmp_path / "run")]) == 0


def test_every_unusable_state_of_a_folder_is_named_at_once(tmp_path, capsys):
    """Two broken states in one folder: `evaluate` and `Debiaser.load` name both (each with its
    file or label), whether the files cannot be read or do not fit the use; one broken state
    is reported as before."""
    config = tmp_path / "config.yaml"
    config.write_text("task: multiple_choice\ncalibrators: [attention_guided, pride]\n")
    states = tmp_path / "states"
    assert main(["calibrate", "--config", str(config), "--count", "3", "--out", str(states)]) == 0
    guided, pride = states / "attention_guided.json", states / "pride.json"
    argv = ["evaluate", "--config", str(config), "--count", "3", "--orders", "1",
            "--out", str(tmp_path / "refused"), "--calibration", str(states)]  # fmt: skip
    adapter = load_adapter(get_registry().default_model("multiple_choice").name)

    for path, field in ((guided, "bias_matrix"), (pride, "logit_prior")):
        path.write_text(json.dumps({**json.loads(path.read_text()), field: None}))
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: 2 problems with the calibration states:\n  - calibration state" in err
    assert f"{guided} does not fit this use: it holds no fitted 'bias_matrix'" in err
    assert f"{pride} does not fit this use: it holds no fitted 'logit_prior'" in err
    assert err.count("Calibrate again") == 1  # the advice both share, once, for the command line
    assert err.endswith("Calibrate again for this model and setting (`posdebias calibrate`).\n")
    with pytest.raises(CalibrationError, match="2 problems with the calibration states") as refused:
        Debiaser.load(states, adapter)
    said = str(refused.value)
    assert "'attention_guided'" in said and "'pride'" in said
    assert said.endswith("(Debiaser.calibrate(instances)).")  # the library's advice

    guided.write_text("{not json")
    pride.write_text("[]")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: 2 problems with the calibration states:" in err
    assert f"{guided} is not valid JSON" in err and f"{pride}: expected a JSON object" in err
    pride.write_text("{also not json")  # now both share their advice: said once, at the end
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("calibrate`") == 1 and f"{pride} is not valid JSON" in err
    assert err.endswith("\n`posdebias calibrate` writes calibration states.\n")
    with pytest.raises(CalibrationError, match="2 problems with the calibration states"):
        Debiaser.load(states, adapter)

    pride.unlink()  # one broken state: its own message, no list
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot be used" not in err
    assert f"error: calibration file {guided} is not valid JSON" in err
    assert not (tmp_path / "refused").exists()


def test_one_state_refused_for_two_labels_is_named_once(tmp_path, capsys):
    """Two rows of one calibrator (same options, other labels) pick the same saved state: its
    refusal is said once, as itself, not as a list of two equal problems."""
    states = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "-N", "5", "--calibrators", "pride",
                 "--out", str(states)]) == 0  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text("calibrators: [{name: pride, label: one}, {name: pride, label: two}]\n")
    capsys.readouterr()
    argv = ["evaluate", "--adapter", "synthetic", "--config", str(config), "--count", "3",
            "--calibration", str(states / "pride.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "problems with" not in err and err.count("made for N=5 candidates, not N=4") == 1


def test_a_folders_refusals_are_listed_together_with_each_advice_once(tmp_path, capsys):
    """Unreadable files and states that do not fit, in one folder, are named in one list
    (the command line and the API alike), each distinct advice once at its end, a path with a
    line break on its own line, a long list cut short before its advice."""
    from posdebias.registry import get_registry

    folder = tmp_path / "states\nx"  # a line break in the path must not start a list item
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride,attention_guided",
                 "--out", str(folder)]) == 0  # fmt: skip
    pride = folder / "pride.json"
    pride.write_text(json.dumps({**json.loads(pride.read_text()), "model_id": "other/model"}))
    (folder / "attention_guided.json").write_text("{not json")
    (folder / "zz.json").write_text("[]")  # a reason without advice
    argv = ["evaluate", "--adapter", "synthetic", "--calibrators", "pride,attention_guided",
            "--count", "3", "--out", str(tmp_path / "refused"),
            "--calibration", str(folder)]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    items = [line for line in err.splitlines() if line.startswith("  - ")]
    assert err.startswith("error: 3 problems with the calibration states:\n") and len(items) == 3
    assert "is not valid JSON" in items[0] and "expected a JSON object" in items[1]
    assert "fitted on model 'other/model'" in items[2] and "states\\nx" in items[2]
    assert err.count("`posdebias calibrate` writes calibration states.") == 1
    assert err.count("Calibrate again") == 1 and err.count("--calibration-transfer") == 1
    assert not (tmp_path / "refused").exists()

    adapter = get_registry().create_adapter("synthetic")
    pride.write_text(json.dumps({**json.loads(pride.read_text()), "options": {"bogus": 1}}))
    with pytest.raises(CalibrationError) as refused:  # a state whose options are refused too
        Debiaser.load(folder, adapter)
    said = str(refused.value)
    assert said.startswith("3 problems with the calibration states:")
    said_at = "calibration state " + str(pride).replace("\n", "\\n")  # one line an item
    assert f"{said_at}: calibrator 'pride': unknown option 'bogus'" in said
    assert said.count("Debiaser.calibrate(instances) and Debiaser.save(path) write") == 1
    # each refusal, for a caller that handles them one by one, with its own advice
    assert isinstance(refused.value, CalibrationErrors)
    apart = [str(error) for error in refused.value.errors]
    assert len(apart) == 3 and "is not valid JSON" in apart[0] and "bogus" in apart[2]
    assert apart[0].endswith("Debiaser.save(path) write calibration states.")

    many = tmp_path / "many"
    many.mkdir()
    for i in range(25):
        (many / f"s{i:02d}.json").write_text("{x")
    assert main([*argv[:-1], str(many)]) == 2
    err = capsys.readouterr().err
    assert "  ... and 5 more\n`posdebias calibrate` writes calibration states.\n" in err
    assert len([line for line in err.splitlines() if line.startswith("  - ")]) == 20


def test_an_advice_that_another_extends_is_said_once_whole(tmp_path, capsys):
    """A state of another model (calibrate again, or allow the transfer) beside a state of
    another adapter (calibrate again): the advice is said once, with the transfer, at every
    door."""
    folder = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride,attention_guided",
                 "--out", str(folder)]) == 0  # fmt: skip
    for name, changes in (
        ("pride", {"model_id": "other/model"}),
        ("attention_guided", {"adapter": "llava"}),
    ):
        path = folder / f"{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "--calibrators", "pride,attention_guided",
                 "--count", "3", "--calibration", str(folder), "--out",
                 str(tmp_path / "refused")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("error: 2 problems with the calibration states:\n")
    assert err.count("Calibrate again") == 1 and err.count("--calibration-transfer") == 1
    with pytest.raises(CalibrationErrors) as refused:
        Debiaser.load(folder, get_registry().create_adapter("synthetic"))
    for door in ("library", "cli", "harness"):
        said = refused.value.message_for(door)
        assert said.count("Calibrate again") == 1 and said.count("calibration transfer") == 1


def test_states_saved_for_several_n_serve_the_run_of_each_n(tmp_path, capsys):
    """`Debiaser.save` writes ``<label>.n<N>.json`` per N; `evaluate` of each N uses the state of
    its N (it picked the first file and refused it for N = 5). A run of another N is refused
    naming every N the states serve, at the command line as in Python (the command line named
    the N = 4 file alone: "made for N=4")."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    debiaser = Debiaser(SyntheticAdapter(), ["pride"])
    debiaser.calibrate([*synthetic_instances(8, 4), *synthetic_instances(8, 5)])
    folder = debiaser.save(tmp_path / "states")
    assert sorted(path.name for path in folder.iterdir()) == ["pride.n4.json", "pride.n5.json"]
    for n in (5, 4):
        argv = ["evaluate", "--adapter", "synthetic", "-N", str(n), "--calibrators", "pride",
                "--calibration", str(folder), "--count", "3",
                "--out", str(tmp_path / f"n{n}")]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
    assert main([*argv[:4], "6", *argv[5:-1], str(tmp_path / "n6")]) == 2
    said = (
        "calibrator 'pride' was fitted for N=4, N=5 candidates (pride.n4.json, pride.n5.json), "
        "but this run has N=6: a fitted calibration serves the N it was fitted for. "
        "Calibrate again for this model and setting (`posdebias calibrate`)."
    )
    assert said in capsys.readouterr().err
    assert not (tmp_path / "n6").exists()
    query = synthetic_instances(1, 6)[0]
    with pytest.raises(CalibrationError) as refused:
        list(Debiaser.load(folder, SyntheticAdapter()).rank_many([query]))
    assert str(refused.value) == (
        "calibrator 'pride' was fitted for N=4, N=5 candidates, but this query has N=6: a fitted "
        "calibration serves the N it was fitted for. Calibrate with instances of N=6 as well: "
        "Debiaser.calibrate(instances) takes instances of several N at once."
    )


def test_two_states_of_one_row_for_one_n_are_refused_at_every_door(tmp_path, capsys):
    """A folder holding two states of one row for one N (`pride.json`, a hand copy, beside
    `pride.n4.json`): every door refuses it naming both (evaluate took one, the API and the
    harnesses the other, and printed other numbers)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.integrations.harness import HarnessConfig, HarnessDebiaser

    folder = tmp_path / "states"
    debiaser = Debiaser(SyntheticAdapter(), ["pride"])
    debiaser.calibrate([*synthetic_instances(8, 4), *synthetic_instances(8, 5)])
    debiaser.save(folder)
    other = Debiaser(SyntheticAdapter(), ["pride"])
    other.calibrate(synthetic_instances(6, 4))
    other.states["pride"].save(folder / "pride.json")
    said = "2 states of 'pride' for N=4 (pride.json, pride.n4.json): keep one"
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "--calibrators", "pride", "--count", "3",
                 "--calibration", str(folder), "--out", str(tmp_path / "run")]) == 2  # fmt: skip
    assert said in capsys.readouterr().err and not (tmp_path / "run").exists()
    with pytest.raises(CalibrationError, match=re.escape(said)):
        Debiaser.load(folder, SyntheticAdapter())
    assert main(["rank", "--adapter", "synthetic", "--calibration", str(folder), "q", "a", "b",
                 "c", "d"]) == 2  # fmt: skip
    assert said in capsys.readouterr().err
    config = HarnessConfig(pretrained="synthetic", calibrators=["pride"], calibration=str(folder))
    with pytest.raises(CalibrationError, match=re.escape(said)):
        HarnessDebiaser(config, adapter=SyntheticAdapter()).calibrate()
    # the N = 5 state alone is no ambiguity: its run goes on
    assert main(["evaluate", "--adapter", "synthetic", "-N", "5", "--calibrators", "pride",
                 "--count", "3", "--calibration", str(folder / "pride.n5.json"),
                 "--out", str(tmp_path / "n5")]) == 0  # fmt: skip


def test_a_save_that_would_leave_other_states_of_its_labels_is_refused(tmp_path, capsys):
    """A state of the same name is replaced and other labels' states stay; a save that would
    leave another state of a label it writes (another N's, named the other way, or a link to
    one) is refused naming it, with nothing written or deleted: no writer leaves a folder with
    two states of a row for one N, or with N the calibration no longer has."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import OutputError

    folder = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "label_free",
                 "--out", str(folder)]) == 0  # fmt: skip
    debiaser = Debiaser(SyntheticAdapter(), ["pride", "vanilla"])
    debiaser.calibrate(synthetic_instances(8, 4))
    debiaser.save(folder)
    debiaser.save(folder)  # the same names again: replaced
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    assert sorted(before) == ["label_free.json", "pride.json", "vanilla.json"]
    debiaser.calibrate([*synthetic_instances(8, 4), *synthetic_instances(8, 5)])
    with pytest.raises(OutputError, match=re.escape(
        "holds other states of 'pride', 'vanilla' that this save would not replace "
        "(pride.json, vanilla.json)"
    )):  # fmt: skip
        debiaser.save(folder)
    assert {p.name: p.read_bytes() for p in folder.glob("*.json")} == before

    several = debiaser.save(tmp_path / "several")
    capsys.readouterr()
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride", "-N", "6",
                 "--out", str(several)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    said = "holds other states of 'pride' that this save would not replace (pride.n4.json, pride.n5.json)"  # noqa: E501
    assert said in err
    assert sorted(p.name for p in several.glob("*.json")) == [
        "pride.n4.json", "pride.n5.json", "vanilla.n4.json", "vanilla.n5.json"
    ]  # fmt: skip
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "pride.json").symlink_to(several / "pride.n5.json")
    with pytest.raises(OutputError, match=re.escape("would not replace (pride.json)")):
        debiaser.save(linked)
    assert sorted(p.name for p in linked.iterdir()) == ["pride.json"]


def test_the_state_of_a_calibrator_that_needs_no_fit_for_another_n_is_not_needed(tmp_path, capsys):
    """`--calibration vanilla.json` (N = 4) for a run of N = 5: vanilla runs without it, and
    pride is fitted by the run (the message said the run had no vanilla calibrator)."""
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride,vanilla",
                 "--out", str(tmp_path / "c4")]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "-N", "5", "--calibrators",
                 "pride,vanilla", "--count", "3", "--calibration",
                 str(tmp_path / "c4" / "vanilla.json"),
                 "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err  # fmt: skip


def test_a_row_of_one_kind_takes_the_state_of_its_n_among_others_alike(tmp_path, capsys):
    """States of one kind and options under two other labels, for N = 4 (`a`) and N = 5 (`b`):
    a `pride` row of N = 5 takes `b` (it took `a` and refused it for its N)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    folder = tmp_path / "kind"
    for label, n in (("a", 4), ("b", 5)):
        debiaser = Debiaser(SyntheticAdapter(), {label: "pride"})
        debiaser.calibrate(synthetic_instances(8, n))
        debiaser.states[label].save(folder / f"{label}.json")
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "-N", "5", "--calibrators", "pride",
                 "--count", "3", "--calibration", str(folder),
                 "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err  # fmt: skip
    used = json.loads((tmp_path / "run" / "states" / "pride.json").read_text())
    assert used == json.loads((folder / "b.json").read_text())


def test_a_label_of_an_earlier_run_that_reads_as_a_state_per_n_still_loads():
    """A label ending in `.n<N>` is refused for a new run, yet the configuration of a run
    written before the rule (its results.json) still reads."""
    from posdebias.errors import ConfigError
    from posdebias.evaluation.config import EvaluateConfig, load_config

    row = {"name": "pride", "label": "x.n4"}
    assert EvaluateConfig.model_validate({"calibrators": [row]}).calibrators[0].label == "x.n4"
    with pytest.raises(ConfigError, match="label 'x.n4': use 1 to 64"):
        load_config(None, adapter="synthetic", calibrators=[row])


def test_a_sweep_takes_no_saved_calibration(tmp_path, capsys):
    """Every point of a study fits its own calibrators: a saved calibration in the config is
    refused (the calibration_size study printed the saved state's numbers at every size), and
    `--calibration` is not read as `--calibration-count`."""
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride",
                 "--out", str(tmp_path / "c")]) == 0  # fmt: skip
    config = tmp_path / "c.yaml"
    config.write_text(f"calibration: {tmp_path / 'c'}\n")
    capsys.readouterr()
    assert main(["sweep", "calibration_size", "--adapter", "synthetic", "--config", str(config),
                 "--out", str(tmp_path / "sweep")]) == 2  # fmt: skip
    assert "so it takes no saved calibration: drop 'calibration'" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()
    with pytest.raises(SystemExit):
        main(["sweep", "calibration_size", "--adapter", "synthetic", "--calibration", "7",
              "--out", str(tmp_path / "sweep")])  # fmt: skip
    assert "unrecognized arguments: --calibration 7" in capsys.readouterr().err


def test_a_label_that_reads_as_a_state_per_n_is_refused_where_it_is_given(tmp_path, capsys):
    """`<label>.n<N>.json` is the state of one of several N, so no label ends in `.n<N>`: the
    config, the API and a hand-renamed file say so (a label `lf.n4` was read as row `lf`)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import ConfigError

    config = tmp_path / "c.yaml"
    config.write_text("calibrators: [{name: label_free, label: lf.n4}]\n")
    assert main(["calibrate", "--adapter", "synthetic", "--config", str(config),
                 "--out", str(tmp_path / "s")]) == 2  # fmt: skip
    assert "not ending in '.' or in '.n' and a number" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="calibrator label 'x.n12' cannot name a file"):
        Debiaser(SyntheticAdapter(), {"x.n12": "pride"})
    with pytest.raises(ConfigError, match="calibrator label '../evil' cannot name a file"):
        Debiaser(SyntheticAdapter(), {"../evil": "pride"})
    debiaser = Debiaser(SyntheticAdapter(), ["pride", "vanilla"])
    debiaser.calibrate(synthetic_instances(8, 4))
    folder = debiaser.save(tmp_path / "states")
    (folder / "pride.json").rename(folder / "pride.n5.json")
    with pytest.raises(CalibrationError, match=re.escape(
        "pride.n5.json holds a state for N=4, but its name says N=5: name it pride.n4.json"
    )):  # fmt: skip
        Debiaser.load(folder, SyntheticAdapter())


def test_api_save_never_replaces_a_file_it_did_not_make(tmp_path):
    """`Debiaser.save` into a folder writes as `posdebias calibrate --out` does: a file that is
    no state is kept, and nothing is written."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import OutputError

    folder = tmp_path / "ow"
    folder.mkdir()
    (folder / "pride.json").write_text('{"my": "notes"}')
    debiaser = Debiaser(SyntheticAdapter(), ["pride", "vanilla"])
    debiaser.calibrate(synthetic_instances(8, 4))
    with pytest.raises(OutputError, match="is not a calibration state"):
        debiaser.save(folder)
    assert (folder / "pride.json").read_text() == '{"my": "notes"}'
    assert sorted(p.name for p in folder.iterdir()) == ["pride.json"]


def test_a_row_of_one_kind_uses_the_state_fitted_with_its_options(tmp_path, capsys):
    """Two states of one kind under other labels (`fast`: iterations 0, `full`: the defaults):
    a `label_free` row takes the one fitted with its options (it took the first and refused)."""
    config = tmp_path / "two.yaml"
    config.write_text("calibrators: [{name: label_free, label: fast, options: {iterations: 0}}, "
                      "{name: label_free, label: full}]\n")  # fmt: skip
    folder = tmp_path / "two"
    assert main(["calibrate", "--adapter", "synthetic", "--config", str(config),
                 "--out", str(folder)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "--calibrators", "label_free",
                 "--count", "3", "--calibration", str(folder),
                 "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err  # fmt: skip
    used = json.loads((tmp_path / "run" / "states" / "label_free.json").read_text())
    assert used == json.loads((folder / "full.json").read_text())


def test_a_calibrator_that_needs_no_fit_serves_any_n_beside_states_of_others(tmp_path, capsys):
    """`vanilla.n4.json` and `vanilla.n5.json` (a several-N save): `evaluate -N 6` runs vanilla
    without them, as the API does (it refused the N = 4 file)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    debiaser = Debiaser(SyntheticAdapter(), ["vanilla"])
    debiaser.calibrate([*synthetic_instances(4, 4), *synthetic_instances(4, 5)])
    folder = debiaser.save(tmp_path / "v")
    assert sorted(p.name for p in folder.iterdir()) == ["vanilla.n4.json", "vanilla.n5.json"]
    assert main(["evaluate", "--adapter", "synthetic", "-N", "6", "--calibrators", "vanilla",
                 "--count", "3", "--calibration", str(folder),
                 "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err  # fmt: skip


def test_one_state_picked_by_two_rows_names_each_row(tmp_path, capsys):
    """Two rows of one calibrator with other options pick the same saved state: each refusal
    names the row it was checked for."""
    states = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "-N", "5", "--calibrators", "pride",
                 "--out", str(states)]) == 0  # fmt: skip
    config = tmp_path / "config.yaml"
    two = "{name: pride, label: two, options: {alpha: 0.5, workflow: test}}"
    config.write_text(f"calibrators: [{{name: pride, label: one}}, {two}]\n")
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "--config", str(config), "--count", "3",
                 "--calibration", str(states)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "2 problems" in err and "pride.json (for 'one')" in err and "(for 'two')" in err


def test_a_version_1_state_naming_layers_gives_each_door_its_advice(tmp_path):
    """A version 1 state cannot name layers: the library's message says how to re-create it in
    Python, the command line's with `posdebias calibrate`."""
    from posdebias import CalibrationState

    states = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "attention_guided",
                 "--out", str(states)]) == 0  # fmt: skip
    path = states / "attention_guided.json"
    payload = json.loads(path.read_text())
    assert payload["layers"]
    path.write_text(json.dumps({**payload, "schema_version": 1}))
    with pytest.raises(CalibrationError, match="cannot name attention layers") as refused:
        CalibrationState.load(path)
    assert str(refused.value).endswith("Debiaser.save(path) write calibration states.")
    said = refused.value.message_for("cli")
    assert said.endswith("; `posdebias calibrate` writes calibration states.")


def test_own_parameters_read_in_python_that_do_not_validate_give_each_door_its_advice(tmp_path):
    """`Calibrator.fitted` on a state whose own parameters do not validate (one built in
    Python, past the gate): a CalibrationError with the library's advice, and the command
    line's for the command line."""
    from posdebias import CalibrationState
    from posdebias.registry import get_calibrator

    config = tmp_path / "config.yaml"
    config.write_text(f"calibrators: [{TESTED_PRIDE}]\n")
    assert main(["calibrate", "--adapter", "synthetic", "--config", str(config), "--out",
                 str(tmp_path / "states")]) == 0  # fmt: skip
    state = CalibrationState.load(tmp_path / "states" / "tested.json")
    pride = get_calibrator("pride", workflow="test", alpha=0.5)
    assert pride.fitted(state).estimation_ids
    broken = state.model_copy(update={"extra": {"estimation_ids": 5}})
    with pytest.raises(CalibrationError, match="calibration state of 'pride': extra: ") as refused:
        pride.fitted(broken)
    assert str(refused.value).endswith("Debiaser.save(path) write calibration states.")
    said = refused.value.message_for("cli")
    assert said.endswith("; `posdebias calibrate` writes calibration states.")


def _harness_on(folder, calibrators=("pride",)):
    """A harness model (as lm-eval and lmms-eval make it) on the synthetic adapter, reading
    the saved states of ``folder``."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.integrations.harness import HarnessConfig, HarnessDebiaser

    config = HarnessConfig(
        pretrained="synthetic", calibrators=list(calibrators), calibration=str(folder)
    )
    harness = HarnessDebiaser(config, adapter=SyntheticAdapter())
    harness.calibrate()
    return harness


def test_states_of_its_kind_saved_apart_per_n_serve_each_n_at_every_door(tmp_path, capsys):
    """`calibrate -N 4 --out k/n4.json` and `-N 5 --out k/n5.json`: a `pride` row takes each N's
    state, as from one several-N save (the harness kept the first file's N only, and refused
    queries of N = 5); a run of N = 6 is refused naming both N and files (it named n4.json
    alone)."""
    from posdebias.adapters.families.synthetic import synthetic_instances

    folder = tmp_path / "k"
    for n in (4, 5):
        assert main(["calibrate", "--adapter", "synthetic", "-N", str(n), "--calibrators",
                     "pride", "--out", str(folder / f"n{n}.json")]) == 0  # fmt: skip
    argv = ["evaluate", "--adapter", "synthetic", "--calibrators", "pride", "--count", "3",
            "--calibration", str(folder)]  # fmt: skip
    for n in (4, 5):
        assert main([*argv, "-N", str(n), "--out", str(tmp_path / f"run{n}")]) == 0
    harness = _harness_on(folder)
    assert harness.debiaser.calibrated_n == [4, 5]
    for n in (4, 5):
        assert harness.answers(synthetic_instances(1, n))[0].of("pride") is not None
    capsys.readouterr()
    assert main([*argv, "-N", "6", "--out", str(tmp_path / "run6")]) == 2
    assert (
        "calibrator 'pride' was fitted for N=4, N=5 candidates (n4.json, n5.json), but this run "
        "has N=6" in capsys.readouterr().err
    )


@pytest.mark.parametrize("name", ["pride.n5.json", "my pride.json"])
@pytest.mark.parametrize("beside", [False, True])
def test_a_file_whose_name_cannot_name_its_row_is_refused_at_every_door(
    tmp_path, capsys, name, beside
):
    """`pride.n5.json` holding a state for N = 4, or `my pride.json`, alone or beside a good
    `pride.json`: `evaluate` and the harness used it (or passed it over) without a word while
    `Debiaser.load` refused it; now every door names it and says to rename it."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter

    said = {
        "pride.n5.json": "pride.n5.json holds a state for N=4, but its name says N=5: name it "
        "pride.n4.json",
        "my pride.json": "my pride.json: its name 'my pride' cannot be a calibrator label",
    }[name]
    folder = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride",
                 "--out", str(folder)]) == 0  # fmt: skip
    if beside:
        (folder / name).write_bytes((folder / "pride.json").read_bytes())
    else:
        (folder / "pride.json").rename(folder / name)
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "--calibrators", "pride", "--count", "3",
                 "--calibration", str(folder), "--out", str(tmp_path / "run")]) == 2  # fmt: skip
    assert said in capsys.readouterr().err and not (tmp_path / "run").exists()
    for door in (lambda: Debiaser.load(folder, SyntheticAdapter()), lambda: _harness_on(folder)):
        with pytest.raises(CalibrationError, match=re.escape(said)):
            door()


def test_states_fitted_with_other_options_for_other_n_are_refused_for_their_options(
    tmp_path, capsys
):
    """States of the row's kind for N = 4 and 5, both fitted with other options than the
    row's: a run of N = 6 names the options too (not as if the row were fitted for N = 4 and
    5: it was fitted for no N)."""
    folder = tmp_path / "states"
    for n, top_k in ((4, 1), (5, 2)):
        config = tmp_path / f"c{n}.yaml"
        row = f"{{name: attention_guided, label: a{n}, options: {{top_k: {top_k}}}}}"
        config.write_text(f"calibrators: [{row}]\n")
        assert main(["calibrate", "--adapter", "synthetic", "-N", str(n), "--config", str(config),
                     "--out", str(folder / f"a{n}.json")]) == 0  # fmt: skip
    mine = tmp_path / "mine.yaml"
    mine.write_text("calibrators: [{name: attention_guided, label: mine, options: {top_k: 3}}]\n")
    capsys.readouterr()
    assert main(["evaluate", "--adapter", "synthetic", "-N", "6", "--config", str(mine),
                 "--count", "3", "--calibration", str(folder),
                 "--out", str(tmp_path / "run")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"calibration state {folder / 'a4.json'} (for 'mine') does not fit this use" in err
    assert "fitted with other options" in err and "was fitted for N=4, N=5" not in err


def test_a_state_refused_for_a_query_is_named_by_its_file(tmp_path, capsys):
    """A loaded state that a query's task refuses is named by the file it was read from
    (it was named 'pride', a file the folder does not hold); at a harness too, where a row's
    own file is named as it is, and a state of its kind under another name says the row."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    debiaser = Debiaser(SyntheticAdapter(), ["pride"])
    debiaser.calibrate([*synthetic_instances(8, 4), *synthetic_instances(8, 5)])
    folder = debiaser.save(tmp_path / "states")
    loaded = Debiaser.load(folder, SyntheticAdapter())
    with pytest.raises(CalibrationError) as refused:
        loaded.rank("q", texts=list("abcd"), task="multiple_choice")
    assert str(refused.value).startswith(
        f"calibration state {folder / 'pride.n4.json'} does not fit this use: its labels are"
    )
    (folder / "pride.n5.json").unlink()
    moved = json.loads((folder / "pride.n4.json").read_text())
    (folder / "pride.n4.json").write_text(json.dumps({**moved, "model_id": "other/model"}))
    argv = ["evaluate", "--adapter", "synthetic", "--calibrators", "pride", "--count", "3",
            "--calibration", str(folder), "--out", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(CalibrationError) as refused:
        _harness_on(folder)
    said = f"calibration state {folder / 'pride.n4.json'} does not fit this use: it was fitted on"
    assert str(refused.value).startswith(said)
    assert main(argv) == 2 and said in capsys.readouterr().err  # the row's own: no "(for"
    (folder / "pride.n4.json").rename(folder / "mine.json")
    with pytest.raises(CalibrationError) as refused:
        _harness_on(folder)
    said = f"calibration state {folder / 'mine.json'} (for 'pride') does not fit this use"
    assert str(refused.value).startswith(said)
    assert main(argv) == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("how", ["flag", "config"])
def test_a_bundled_text_models_state_serves_its_default_run(tmp_path, capsys, how):
    """`calibrate --model posdebias/text-organism` then `evaluate` of the same model without
    `--task`: both pose the model's own multiple-choice questions, so the state fits (evaluate
    checked it against the retrieval prompt and refused it: "fitted with another prompt")."""
    if how == "flag":
        model = ["--model", "posdebias/text-organism"]
    else:
        config = tmp_path / "run.yaml"
        config.write_text("adapter: {options: {model: posdebias/text-organism}}\n")
        model = ["--config", str(config)]
    assert main(["calibrate", *model, "--calibrators", "pride", "--count", "8",
                 "--out", str(tmp_path / "cal")]) == 0  # fmt: skip
    assert main(["evaluate", *model, "--calibrators", "pride", "--count", "3", "--orders", "1",
                 "--calibration", str(tmp_path / "cal"),
                 "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err  # fmt: skip
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["calibrators"]["pride"]["calibration"]["source"] == "saved"


def test_a_state_file_whose_name_no_label_may_have_is_named_with_the_other_refusals(tmp_path):
    """`pri\\nde.json` (a copy of a state under a name no calibrator label may have) beside a
    broken file: `Debiaser.load` names both, the file's own name and what to do (it stopped at
    the label's ConfigError, naming neither file and dropping the other refusal)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter

    folder = tmp_path / "states"
    assert main(["calibrate", "--adapter", "synthetic", "--calibrators", "pride",
                 "--out", str(folder)]) == 0  # fmt: skip
    (folder / "pri\nde.json").write_bytes((folder / "pride.json").read_bytes())
    (folder / "zz.json").write_text("[]")
    with pytest.raises(CalibrationErrors) as refused:
        Debiaser.load(folder, SyntheticAdapter())
    misnamed, broken = (str(error) for error in refused.value.errors)  # in the files' order
    assert broken == f"{folder / 'zz.json'}: expected a JSON object, got list"
    assert misnamed == (
        f"calibration state {folder}/pri\nde.json: its name 'pri\\nde' cannot be a "
        "calibrator label (use 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
        "or digit, not ending in '.' or in '.n' and a number (the name of a state per N)): "
        "rename the file"
    )
    (folder / "zz.json").unlink()
    with pytest.raises(CalibrationError, match="'pri\\\\nde' cannot be a calibrator label"):
        Debiaser.load(folder, SyntheticAdapter())


def test_check_poses_a_bundled_models_own_task_as_evaluate_does(capsys):
    """`check --model posdebias/text-organism` without `--task` checks the multiple-choice
    prompt that `evaluate` and `calibrate` of the same arguments pose (it assumed retrieval
    and stopped: "a text-only model: it has no retrieval prompt")."""
    for argv in (["--model", "posdebias/text-organism"], ["--task", "multiple_choice"]):
        assert main(["check", *argv]) == 0, capsys.readouterr().err
        rows = capsys.readouterr().out
        assert "options rotated by 1" in rows and "all 7 checks passed" in rows


def test_rank_poses_a_text_query_with_its_tasks_labels_on_a_model_of_any_path(
    tmp_path, organism, questions, capsys
):
    """`posdebias rank` names no task when it builds the adapter: it labelled every query of a
    model that is not bundled with retrieval's digits and refused the states `calibrate` made
    for multiple choice (letters). The text organism copied to a folder is such a model."""
    import shutil

    model = shutil.copytree(organism.path, tmp_path / "model")
    states = tmp_path / "states"
    assert main(["calibrate", "--model", str(model), "--benchmark", str(organism.benchmark(4)),
                 "--count", "3", "--calibrators", "pride", "--out", str(states)]) == 0  # fmt: skip
    capsys.readouterr()
    for task in ([], ["--task", "multiple_choice"]):
        assert main(["rank", "--model", str(model), "--calibration", str(states), *task,
                     questions[0].stem, *questions[0].texts]) == 0  # fmt: skip
        assert "<- chosen" in capsys.readouterr().out
    config = config_from_data({"model": str(model)}, "test")
    adapter = build_adapter(config)
    assert adapter.label_set is None  # each query's task's own set
    assert adapter.labels_for(2, "pairwise_judge") == ["A", "B"]
    assert adapter.labels_for(2, "rerank") == ["1", "2"]


def test_the_bundled_text_model_reranks_with_its_own_labels_at_every_door(
    tmp_path, organism, adapter, capsys
):
    """The bundled text model knows its letters only: the API posed rerank queries with them,
    `calibrate` and `evaluate` with rerank's digits (refused: they tokenize alike). Every door
    now takes the model's own labels, and a state of one door is accepted by the other."""
    source = organism.benchmark(4)
    bench = tmp_path / "rerank"
    bench.mkdir()
    lines = [json.loads(line) for line in (source / "benchmark.jsonl").read_text().splitlines()]
    data = "".join(json.dumps({**line, "task": "rerank"}) + "\n" for line in lines[:12]).encode()
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.update(task="rerank", benchmark_sha256=hashlib.sha256(data).hexdigest())
    (bench / "benchmark.jsonl").write_bytes(data)
    (bench / "manifest.json").write_text(json.dumps(manifest))
    cli_state = tmp_path / "cli.json"
    calibrate = ["calibrate", "--model", organism.name, "--benchmark", str(bench), "--count", "3",
                 "--calibrators", "pride", "--out", str(cli_state)]  # fmt: skip
    assert main(calibrate) == 0, capsys.readouterr().err
    reranked = load_benchmark(bench).instances
    debiaser = Debiaser(adapter, "pride")
    debiaser.calibrate(reranked[:3])
    api_state = debiaser.save(tmp_path / "api.json")
    for state in (cli_state, api_state):
        out = tmp_path / f"run-{state.stem}"
        assert main(["evaluate", "--model", organism.name, "--benchmark", str(bench),
                     "--calibration", str(state), "--calibrators", "pride", "--count", "4",
                     "--orders", "2", "--calibration-count", "3",
                     "--out", str(out)]) == 0, capsys.readouterr().err  # fmt: skip
        assert json.loads((out / "run.json").read_text())["adapter"]["labels"] == list("ABCD")
        Debiaser.load(state, adapter)  # and the API takes either


def test_a_harness_calibration_count_the_task_cannot_hold_is_refused():
    """``calibration_count=7`` on a task whose calibration split holds 4 calibrated on 4
    without a word; the default (not asked for) still takes what the split holds."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import ConfigError
    from posdebias.integrations.harness import HarnessConfig, HarnessDebiaser

    items = synthetic_instances(4, 4, 0, "cal")
    for source in ("task", None):
        asked = {"calibration_count": 7} if source else {}
        config = HarnessConfig(
            pretrained="synthetic", calibrators=["pride"], calibration="task", **asked
        )
        harness = HarnessDebiaser(config, adapter=SyntheticAdapter())
        if source:
            with pytest.raises(ConfigError, match="calibration_count=7, but the task's"):
                harness.calibrate(lambda: items)
        else:
            harness.calibrate(lambda: items)
            assert harness.provenance is not None
            assert harness.provenance["calibration_ids"] == [item.id for item in items]


def test_an_n_study_of_a_model_not_bundled_labels_its_task_as_evaluate(tmp_path, organism, capsys):
    """The n study's adapter is built from the benchmarks' pattern (``.../n{n}``), a folder
    that does not exist: it was labelled as retrieval (digits), which the text model cannot
    tell apart, where `evaluate` on each benchmark uses multiple choice's letters."""
    import shutil

    model = shutil.copytree(organism.path, tmp_path / "model")
    folders = [organism.benchmark(n) for n in (3, 4)]
    pattern = str(folders[1].parent / "n{n}")
    assert folders[1].name == "n4" and folders[0] == folders[1].parent / "n3"
    out = tmp_path / "sweep"
    study = ["sweep", "n", "--model", str(model), "--benchmark", pattern, "--values", "3,4",
             "--count", "4", "--orders", "1", "--calibration-count", "3",
             "--calibrators", "vanilla,pride", "--out", str(out)]  # fmt: skip
    assert main(study) == 0, capsys.readouterr().err
    assert (out / "results.csv").read_text().count("\n") == 1 + 2 * 2
