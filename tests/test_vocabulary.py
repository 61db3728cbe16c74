"""One vocabulary: a text run says "candidate" or its task's own noun, never "image" (terminal
output, report.md, figure texts, `check` rows, record keys), and the run directories and states
written before the rename keep loading."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from posdebias.cli import main
from posdebias.core.instance import candidate_noun
from posdebias.core.state import CalibrationState
from posdebias.evaluation.figures import REPORT_FIGURES
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.runner import InstanceRecord

OLD_RUN = Path(__file__).parent / "fixtures" / "run-0.2"
#: text runs whose files recorded the retrieval prompt (README.md there)
TEXT_BEFORE = Path(__file__).parent / "fixtures" / "text-prompt-0.5"
TEXT_RUN = ["--task", "multiple_choice", "--count", "4", "--orders", "2",
            "--calibration-count", "4"]  # fmt: skip


def keys(value: object) -> list[str]:
    """Every key of a JSON value, nested ones included."""
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in keys(v)]
    return []


def figure_texts(results: EvaluationResults) -> list[str]:
    import matplotlib.text

    texts = []
    for _, title, draw in REPORT_FIGURES:
        texts.append(title)
        figure = draw(results)
        if figure is not None:
            texts += [t.get_text() for t in figure.findobj(matplotlib.text.Text)]
    return texts


def test_candidate_nouns_are_the_tasks_own():
    assert candidate_noun("multiple_choice") == "options"
    assert candidate_noun("pairwise_judge", plural=False) == "answer"
    assert candidate_noun("rerank") == "passages"
    assert candidate_noun("retrieval", plural=False) == "image"
    assert candidate_noun(None) == "candidates"


def test_a_text_multiple_choice_run_never_says_image(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["evaluate", "--task", "multiple_choice", "--count", "6", "--orders", "2",
            "--calibrators", "vanilla,pride,attention_guided,label_free", "--decoders", "sofa",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "image" not in (captured.out + captured.err).lower()
    report = (out / "report.md").read_text()
    assert "N = 4 options" in report and "same option chosen" in report
    assert "image" not in report.lower()
    records = [json.loads(line) for line in (out / "records.jsonl").open()]
    assert records and all("chosen" in record for record in records)
    assert not [k for k in keys(records) if "image" in k.lower()]
    results = EvaluationResults.load(out / "results.json")
    texts = figure_texts(results)
    assert any("right candidate" in text for text in texts)
    assert not [text for text in texts if "image" in text.lower()]
    for name in ("run.json", "results.json"):  # the prompt it posed, not retrieval's
        recorded = json.loads((out / name).read_text())
        assert not [k for k in keys(recorded) if "image" in k.lower()], name
        described = recorded["adapter"]
        assert "multiple-choice question" in described["prompt"]["instruction"], name
        assert "image" not in described["prompt"]["instruction"].lower(), name
    assert main(["check", "--task", "multiple_choice"]) == 0
    rows = capsys.readouterr().out
    assert "options rotated by 1" in rows and "image" not in rows.lower()


@pytest.mark.figures
def test_a_text_study_never_says_image(tmp_path, capsys, monkeypatch):
    """`sweep n` on text questions: its terminal output, report.md and figure (the x axis
    names the task's candidates) say "options"."""
    import matplotlib.text

    import posdebias.evaluation.sweep as sweep
    from posdebias.evaluation.figures import sweep_figure
    from posdebias.evaluation.sweep.outputs import axis_label

    drawn_for: list[tuple[str, str | None]] = []
    figure_files = sweep.figure_files

    def recorded(study, rows, task):
        drawn_for.append((study, task))
        return figure_files(study, rows, task)

    monkeypatch.setattr(sweep, "figure_files", recorded)
    out = tmp_path / "study"
    argv = ["sweep", "n", "--task", "multiple_choice", "--values", "2,3", "--count", "4",
            "--orders", "2", "--calibrators", "vanilla,attention_guided",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "image" not in (captured.out + captured.err).lower()
    assert "image" not in (out / "report.md").read_text().lower()
    assert drawn_for == [("n", "multiple_choice")]
    with open(out / "results.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    figure = sweep_figure("n", rows, axis_label("n", "multiple_choice"))
    texts = [t.get_text() for t in figure.findobj(matplotlib.text.Text)]
    assert "N (options per instance)" in texts
    assert not [text for text in texts if "image" in text.lower()]


def test_text_errors_name_the_tasks_candidates(tmp_path, capsys):
    """A transfer between text benchmarks of different N says "options", not "images"."""
    from real_models import wordnet_benchmark

    benchmarks = [wordnet_benchmark("capitals", 6, n, 0, tmp_path / f"n{n}") for n in (3, 4)]
    capsys.readouterr()
    out = tmp_path / "transfer"
    argv = ["sweep", "transfer", "--benchmarks", *map(str, benchmarks), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "same number of options per instance" in err and "image" not in err.lower()
    assert not out.exists()


def test_a_run_directory_written_before_the_rename_resumes(tmp_path):
    """Records that say ``chosen_images`` (0.2) are read; the resumed run makes no forward
    pass and gives the numbers the run gave then."""
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    before = json.loads((run / "results.json").read_text())
    observations = (run / "observations.jsonl").read_bytes()
    argv = ["evaluate", "--adapter", "synthetic", "--count", "4", "--orders", "2",
            "--calibration-count", "2", "--calibrators", "vanilla,pride",
            "--out", str(run), "--resume"]  # fmt: skip
    assert main(argv) == 0
    assert (run / "observations.jsonl").read_bytes() == observations  # nothing observed again
    after = json.loads((run / "results.json").read_text())
    for label in ("vanilla", "pride"):
        then, now = before["calibrators"][label]["metrics"], after["calibrators"][label]["metrics"]
        assert {key: now[key] for key in then} == then  # (a later version may add a metric)
    line = (OLD_RUN / "records.jsonl").read_text().splitlines()[0]
    record = InstanceRecord.from_dict(json.loads(line))
    assert record.chosen == json.loads(line)["chosen_images"]
    assert "chosen" in record.to_dict() and "chosen_images" not in record.to_dict()
    for state in (OLD_RUN / "states").glob("*.json"):
        assert CalibrationState.load(state).n == 4


@pytest.mark.parametrize("image_size", [None, 224])
def test_text_runs_that_recorded_the_retrieval_prompt_resume(
    tmp_path, monkeypatch, capsys, image_size
):
    """A text run and a text study written when every run recorded the retrieval prompt (and
    the image settings, null or as configured, which a text model never used) resume without
    a forward pass, to the numbers they had, and now record the prompt they posed."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    run, study = tmp_path / "run", tmp_path / "study"
    shutil.copytree(TEXT_BEFORE / "run", run)
    shutil.copytree(TEXT_BEFORE / "sweep", study)
    for record in (run / "run.json", run / "results.json", study / "sweep.json"):
        written = json.loads(record.read_text())
        assert written["adapter"]["image_size"] is None  # as the older version wrote it
        written["adapter"] |= {"image_size": image_size, "max_patches": image_size}
        record.write_text(json.dumps(written, indent=2))
    before = json.loads((run / "results.json").read_text())
    assert "Given {n} images" in json.dumps(before["adapter"]["prompt"])
    observed = {path: path.read_bytes() for path in (run / "observations.jsonl",
                                                    study / "observations.jsonl")}  # fmt: skip
    table = (study / "results.csv").read_bytes()
    argv = ["evaluate", *TEXT_RUN, "--calibrators", "vanilla,pride,attention_guided",
            "--out", str(run), "--resume"]  # fmt: skip
    assert main(argv) == 0
    argv = ["sweep", "tau", *TEXT_RUN, "--values", "1", "--calibrators",
            "vanilla,attention_guided", "--out", str(study), "--resume"]  # fmt: skip
    assert main(argv) == 0
    for path, data in observed.items():
        assert path.read_bytes() == data, path  # nothing observed again
    assert (study / "results.csv").read_bytes() == table
    after = json.loads((run / "results.json").read_text())
    for label, result in before["calibrators"].items():
        assert after["calibrators"][label]["metrics"] == result["metrics"]
    assert "multiple-choice question" in after["adapter"]["prompt"]["instruction"]
    assert after["adapter"]["prompt_hash"] != before["adapter"]["prompt_hash"]
    # another prompt than the run's is still refused
    config = tmp_path / "other.json"
    other = {"adapter": {"options": {"task_prompt": {"instruction": "Pick."}}}}
    config.write_text(json.dumps(other))
    argv = ["evaluate", *TEXT_RUN, "--config", str(config), "--out", str(run), "--resume"]
    capsys.readouterr()
    assert main(argv) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_an_unknown_option_of_a_text_model_is_answered_without_image_options():
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    with pytest.raises(posdebias.errors.ConfigError, match="unknown option 'bogus'") as text:
        posdebias.get_adapter(*tiny_model_and_processor("llama"), bogus=1)
    with pytest.raises(posdebias.errors.ConfigError, match="unknown option 'bogus'") as vision:
        posdebias.get_adapter(*tiny_model_and_processor("llava"), bogus=1)
    assert "label_set" in str(text.value) and "image" not in str(text.value)
    assert "image_size" in str(vision.value) and "max_patches" in str(vision.value)


def test_a_text_model_refuses_the_retrieval_prompt_it_would_not_pose():
    """The option was accepted and did nothing (a text model poses no retrieval prompt)."""
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    retrieval = {"instruction": "Pick one of {n}."}
    with pytest.raises(
        posdebias.errors.ConfigError,
        match=r"leave out the option\(s\) prompt \(a text task's prompt is the option task_prompt",
    ):
        posdebias.get_adapter(*tiny_model_and_processor("llama"), prompt=retrieval)
    with pytest.raises(posdebias.errors.ConfigError, match="unknown option 'bogus'") as error:
        posdebias.get_adapter(*tiny_model_and_processor("qwen3"), bogus=1)
    offered = str(error.value).split("options: ")[1].split(", ")
    assert "task_prompt" in offered and "prompt" not in offered
    vision = posdebias.get_adapter(*tiny_model_and_processor("llava"), prompt=retrieval)
    assert vision.task_templates["retrieval"].instruction == "Pick one of {n}."


@pytest.mark.parametrize("option", [{"image_size": 336}, {"max_patches": "reference"}])
def test_a_text_model_refuses_the_image_options_it_would_not_use(tmp_path, capsys, option):
    """They were accepted and did nothing; the reference protocol's image size is proposed, not
    asked for, so a text run under it still runs (and records no image setting)."""
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    (name,) = option
    with pytest.raises(posdebias.errors.ConfigError, match=f"leave out the option.s. {name}"):
        posdebias.get_adapter(*tiny_model_and_processor("llama"), **option)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"adapter": {"options": option}}))
    assert main(["evaluate", *TEXT_RUN, "--config", str(config), "--out", str(tmp_path / "a")]) == 2
    assert f"leave out the option(s) {name}" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    out = tmp_path / "reference"
    assert main(["evaluate", *TEXT_RUN, "--protocol", "reference", "--out", str(out)]) == 0
    for record in ("run.json", "results.json"):
        assert not [k for k in keys(json.loads((out / record).read_text())) if "image" in k]


def test_a_run_that_shows_no_image_records_no_image_option():
    """A text run through a server recorded the server's option "images" (how it would send
    images it had none of); older records that hold it still resume."""
    from posdebias.adapters.base import describe_adapter
    from posdebias.adapters.server import ServerAdapter
    from posdebias.evaluation.job import saved_identity

    served = ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m")
    assert describe_adapter(served, 4, "multiple_choice")["images"] == "content"
    text = describe_adapter(served, 4, "multiple_choice", images=False)
    assert not [key for key in text if "image" in key]
    older = {"adapter": {**text, "images": "placeholder"}}
    assert saved_identity(older, {"adapter": text}, None, served.image_options) == {"adapter": text}
    assert saved_identity(older, {"adapter": text}) != {"adapter": text}  # not for other keys


def test_a_text_model_folder_with_a_retrieval_prompt_file_loads(tmp_path):
    """The folder's posdebias_prompt.json is a retrieval prompt, which a text model never
    poses: it is not read (it was passed on as the option prompt, then refused)."""
    import posdebias
    from posdebias.testing import save_tiny_model

    folder = save_tiny_model("qwen3", tmp_path / "model")
    (folder / "posdebias_prompt.json").write_text(json.dumps({"instruction": "Pick one."}))
    adapter = posdebias.load_adapter(folder)
    assert adapter.task_templates["multiple_choice"].instruction != "Pick one."


def test_the_reference_protocol_keeps_a_sofa_option_given_by_its_former_name(tmp_path):
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.protocol import REFERENCE, apply_specs

    for given in (False, True):
        config = EvaluateConfig.model_validate(
            {"decoders": [{"name": "sofa", "options": {"within_image": given}}]}
        )
        (sofa,) = apply_specs(REFERENCE, config, None).decoders
        assert sofa.options["within_image"] is given and "within_candidate" not in sofa.options
        assert sofa.options["answer"] == "generated"  # the protocol's other options


def test_sofa_reads_its_option_under_the_name_it_had_before_text_candidates(tmp_path, capsys):
    from posdebias.evaluation.config import EvaluateConfig, load_config
    from posdebias.evaluation.job import build_decoders

    config = tmp_path / "c.json"
    sofa = {"name": "sofa", "options": {"within_image": True}}
    config.write_text(json.dumps({"decoders": [sofa]}))
    # recorded under its name: a run's settings hold no "within_image"
    assert load_config(config).decoders[0].options == {"within_candidate": True}
    sofa["options"] |= {"within_candidate": False}
    config.write_text(json.dumps({"decoders": [sofa]}))
    assert main(["evaluate", *TEXT_RUN, "--config", str(config)]) == 2
    assert "within_image is the former name of within_candidate: give one" in (
        capsys.readouterr().err
    )

    for name in ("within_image", "within_candidate"):
        config = EvaluateConfig.model_validate(
            {"decoders": [{"name": "sofa", "options": {name: True}}]}
        )
        (sofa,) = build_decoders(config).values()
        assert sofa.options.model_dump()["within_candidate"] is True
        assert "within_image" not in sofa.options.model_dump()


def test_a_text_benchmark_reads_without_the_folder_its_questions_came_from(tmp_path, capsys):
    """It was refused ("the image root ... does not exist"): its texts are in the benchmark."""
    from posdebias.benchmarks.files import load_benchmark
    from real_models import wordnet_questions

    (tmp_path / "data").mkdir()
    questions = wordnet_questions("capitals", 12, 4, 0, tmp_path / "data" / "q.jsonl")
    bench = tmp_path / "bench"
    argv = ["build", "--source", "mcq", "--data", str(questions), "-N", "4", "--out", str(bench)]
    assert main(argv) == 0
    (tmp_path / "data").rename(tmp_path / "moved")
    assert len(load_benchmark(bench).instances) == 12
    capsys.readouterr()
    argv = ["evaluate", "--adapter", "synthetic", "--benchmark", str(bench), "--count", "4",
            "--calibration-count", "4", "--orders", "2", "--calibrators", "vanilla"]  # fmt: skip
    assert main(argv) == 0
    assert "image" not in capsys.readouterr().err.lower()


def test_a_vision_family_forced_on_a_text_model_says_what_to_do():
    """It said "TokenizersBackend has no tokenizer"."""
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    model, tokenizer = tiny_model_and_processor("llama")
    with pytest.raises(posdebias.errors.AdapterError, match="a tokenizer .* was given") as error:
        posdebias.get_adapter(model, tokenizer, adapter="llava")
    assert "vision-language models" in str(error.value)
    with pytest.raises(posdebias.errors.AdapterError, match="needs the model's processor"):
        posdebias.get_adapter(model, None, adapter="llama")


def test_a_text_benchmark_without_task_runs_the_bundled_text_model(tmp_path, monkeypatch):
    """`evaluate --benchmark TEXT_BENCH` without --task loaded the retrieval organism (and
    failed: "labels 'A' and 'B' tokenize identically")."""
    from posdebias.registry import get_registry

    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    bundled = get_registry().default_model("multiple_choice")
    bench = bundled.benchmark(4)
    out = tmp_path / "run"
    argv = ["evaluate", "--benchmark", str(bench), "--count", "4", "--calibration-count", "4",
            "--orders", "2", "--calibrators", "vanilla", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["adapter"]["model_id"] == bundled.name
    assert results["settings"]["task"] == "multiple_choice"
