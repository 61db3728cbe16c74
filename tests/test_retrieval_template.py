"""Retrieval is a task template like the other three: it renders the prompts the older
retrieval prompt rendered, byte for byte, and what posdebias wrote before (run directories,
saved states, prompt files in the older form; tests/fixtures/retrieval-0.4, written by main
before the change) keeps loading, fitting and resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.tasks import (
    DEFAULT_TEMPLATES,
    former_digest,
    task_template,
    task_variant,
    template_fields,
)
from posdebias.errors import ConfigError

OLD = Path(__file__).parent / "fixtures" / "retrieval-0.4"
ORGANISM = Path(__file__).resolve().parents[1] / "src" / "posdebias" / "organism" / "model"
#: the run of OLD/run (its README): the bundled organism's default benchmark
RUN = ["--count", "12", "--calibration-count", "5", "--orders", "2",
       "--calibrators", "vanilla,attention_guided"]  # fmt: skip

CASES = json.loads((OLD / "prompts.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{sorted(c['fields'])}-{c['variant']}")
def test_older_retrieval_prompts_render_byte_for_byte(case):
    """Six older-form prompts (image prefixes and suffixes, images after the instruction, a
    system prompt, a trailing space, a caption-only query) under every variant: today's
    template of the same fields renders the same messages, and its older digest is the one
    the older prompt recorded."""
    template = task_template("retrieval", case["fields"])
    varied = task_variant("retrieval", template, case["variant"], case["label_set"])
    images = tuple(f"image{k}.png" for k in range(case["n"]))
    query = Instance(stem=case["caption"], images=images, id="q")
    assert varied.messages(query, get_label_set(case["label_set"])) == case["messages"]
    assert former_digest(varied) == case["digest"]
    assert varied.digest() != case["digest"]  # one hash per task: today's is the template's


def test_the_default_retrieval_template_is_the_older_default():
    assert task_template("retrieval", {}) == DEFAULT_TEMPLATES["retrieval"]
    older = next(c for c in CASES if not c["fields"] and c["variant"] == "plain")
    assert former_digest(DEFAULT_TEMPLATES["retrieval"]) == older["digest"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image_prefix": "{label}", "candidate": "{image}{text}"}, "not both"),
        ({"images_first": False, "layout": "stem_first"}, "not both"),
        ({"image_prefix": 3}, "must be texts"),
        ({"images_first": "yes"}, "true or false"),
        ({"image_prefix": "{text}"}, "more than once"),
        ({"image_suffix": "{nope}"}, "placeholders"),
    ],
)
def test_older_fields_are_read_or_refused_clearly(fields, message):
    with pytest.raises(ConfigError, match=message):
        task_template("retrieval", fields)


def test_a_template_the_older_form_cannot_say_has_no_older_digest():
    assert template_fields({"image_suffix": "!"})["candidate"] == "{image}!{text}"
    for fields in (
        {"stem": "Look:"},
        {"candidate_separator": " "},
        {"candidate": "{label}. {text}"},
        {"candidate": "{image}{text} ({label})"},
    ):
        assert former_digest(task_template("retrieval", fields)) is None, fields


def test_a_run_directory_written_before_resumes(tmp_path):
    """The older run file records the prompt in the older form; the resumed run reads it as
    today's template, makes no forward pass and gives the numbers the run gave then."""
    run = tmp_path / "run"
    shutil.copytree(OLD / "run", run)
    saved = json.loads((run / "run.json").read_text())
    assert "image_prefix" in saved["adapter"]["prompt"]  # the older form, as written then
    before = json.loads((run / "results.json").read_text())
    observations = (run / "observations.jsonl").read_bytes()
    assert main(["evaluate", *RUN, "--out", str(run), "--resume"]) == 0
    assert (run / "observations.jsonl").read_bytes() == observations
    after = json.loads((run / "results.json").read_text())
    for label in ("vanilla", "attention_guided"):
        assert after["calibrators"][label]["metrics"] == before["calibrators"][label]["metrics"]
    assert after["adapter"]["prompt"]["candidate"] == "{label}{image}{text}"


def test_a_fresh_run_gives_the_older_runs_numbers(tmp_path):
    out = tmp_path / "run"
    assert main(["evaluate", *RUN, "--out", str(out)]) == 0
    now = json.loads((out / "results.json").read_text())
    then = json.loads((OLD / "run" / "results.json").read_text())
    assert now["calibrators"] == then["calibrators"]
    assert now["adapter"]["prompt_hash"] != then["adapter"]["prompt_hash"]
    for name in ("vanilla", "attention_guided"):
        fresh = json.loads((out / "states" / f"{name}.json").read_text())
        older = json.loads((OLD / "run" / "states" / f"{name}.json").read_text())
        assert {k: v for k, v in fresh.items() if k != "prompt_hash"} == {
            k: v for k, v in older.items() if k != "prompt_hash"
        }


def _variant_config(tmp_path: Path) -> Path:
    config = json.loads((OLD / "variant-config.json").read_text())
    config["adapter"]["options"]["model"] = str(ORGANISM)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_states_fitted_before_fit_the_same_prompt_through_every_door(tmp_path, capsys):
    """States of an older-form prompt under a variant (OLD/states-variant) are accepted by
    ``evaluate --calibration`` and by the API with that prompt, and refused with another."""
    import posdebias
    from posdebias.errors import CalibrationError
    from posdebias.organism.benchmark import bundled_benchmark
    from posdebias.testing import write_test_images

    config = _variant_config(tmp_path)
    argv = ["evaluate", "--benchmark", str(bundled_benchmark()), "--count", "8",
            "--calibration-count", "5", "--orders", "2", "--calibrators", "pride",
            "--calibration", str(OLD / "states-variant")]  # fmt: skip
    assert main([*argv, "--config", str(config), "--out", str(tmp_path / "same")]) == 0
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "other")]) == 2
    assert "fitted with another prompt" in capsys.readouterr().err
    assert not (tmp_path / "other" / "results.json").exists()

    options = json.loads(config.read_text())["adapter"]["options"]
    del options["model"]
    state = OLD / "states-variant" / "pride.json"
    debiaser = posdebias.Debiaser.load(state, posdebias.load_adapter(ORGANISM, **options))
    images = write_test_images(tmp_path / "images", 4)
    assert sorted(debiaser.rank("a red circle", images).order) == [0, 1, 2, 3]
    with pytest.raises(CalibrationError, match="another prompt"):
        posdebias.Debiaser.load(state, posdebias.load_adapter(ORGANISM))


def test_the_prompt_options_are_declared_once_for_every_adapter_that_renders_prompts():
    """The Hugging Face adapters and the openai adapter take the same prompt options, with the
    same descriptions and the same checks (one declaration, PromptOptions)."""
    from pydantic import ValidationError

    from posdebias.adapters.hf import HFAdapterOptions, PromptOptions
    from posdebias.adapters.server import ServerOptions

    server = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    for options, required in ((HFAdapterOptions, {}), (ServerOptions, server)):
        assert issubclass(options, PromptOptions)
        for name, field in PromptOptions.model_fields.items():
            assert options.model_fields[name].description == field.description, name
        for bad, message in (
            ({"label_set": "emoji"}, "unknown label set 'emoji'"),
            ({"prompt_variant": "loud"}, "unknown prompt variant 'loud'"),
            ({"prompt": {"image_prefix": 3}}, "must be texts"),
        ):
            with pytest.raises((ValidationError, ConfigError), match=message):
                options(**required, **bad)
        parsed = options(**required, prompt={"image_prefix": "{label}"})
        assert parsed.prompt.candidate == "{label}{image}{text}"
