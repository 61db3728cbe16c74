"""Retrieval is a task template like the other three: it renders the prompts the older
retrieval prompt rendered, byte for byte, and what posdebias wrote before (run directories,
saved states, prompt files in the older form; tests/fixtures/retrieval-0.4, written by main
before the change) keeps loading, fitting and resuming."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import flat
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
        ({"image_prefix": "{text}"}, "image_prefix '{text}' is invalid"),
        ({"image_prefix": "{image}"}, "image goes between image_prefix and image_suffix"),
        ({"image_suffix": "{nope}"}, "image_suffix '{nope}' is invalid"),
        ({"candidate": "{label}{image:>3}{text}"}, "no format spec or conversion"),
        ({"candidate": "{image!r}{text}"}, "no format spec or conversion"),
        ({"candidate": "{label}{image}{{text}}"}, "never shows the candidate"),
        ({"candidate": "{text}{image}"}, "put {image} before {text}"),
        ({"tie_label": "C"}, "pairwise judge's answer"),
    ],
)
def test_older_fields_are_read_or_refused_clearly(fields, message):
    from posdebias.adapters.hf.prompt import coerce_prompt

    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        coerce_prompt(fields)
    assert str(caught.value).count("prompt") <= 3  # one prefix, not "prompt template: prompt:"


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"image_prefix": "{{text}} {label}"}, ["{text} 1", "image", "{text} 2", "image"]),
        ({"candidate": "{{{label}}}{image}{text}"}, ["{1}", "image", "{2}", "image"]),
        ({"image_suffix": "}}", "image_prefix": "{{image}}"}, ["{image}", "image", "}"]),
    ],
)
def test_escaped_braces_are_text(fields, shown):
    """Braces written twice show once, in either form (they were placeholders to a check that
    looked for the text "{text}")."""
    template = task_template("retrieval", fields)
    query = Instance(stem="c", images=("a.png", "b.png"), id="q")
    content = template.messages(query, get_label_set("digits"))[0]["content"]
    items = [item.get("text", item["type"]) for item in content]
    assert items[: len(shown)] == shown


def test_a_caption_with_a_conversion_is_shown():
    template = task_template("retrieval", {"query": "Caption: {caption!r}\nAnswer:"})
    query = Instance(stem="a cat", images=("a.png", "b.png"), id="q")
    text = template.messages(query, get_label_set("digits"))[0]["content"][-1]["text"]
    assert text.endswith("Caption: 'a cat'\nAnswer:")


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
        fresh, older = (
            flat({k: v for k, v in state.items() if k != "prompt_hash"}) for state in (fresh, older)
        )
        # the fitted numbers come from the organism's float32 forwards, whose last bits depend
        # on the CPU's vector kernels (AVX2 and AVX-512 round differently): equal within float32
        # rounding; every other field (names, N, layers, labels) exactly
        assert fresh.keys() == older.keys()
        assert fresh == {
            key: pytest.approx(value, rel=1e-6, abs=1e-7) if isinstance(value, float) else value
            for key, value in older.items()
        }


def test_states_fitted_before_fit_the_same_prompt_through_every_door(tmp_path, capsys):
    """States of an older-form prompt under a variant (OLD/states-variant) are accepted by
    ``evaluate --calibration`` and by the API with that prompt, and refused with another."""
    import posdebias
    from posdebias.errors import CalibrationError
    from posdebias.organism.benchmark import bundled_benchmark
    from posdebias.testing import write_test_images

    config = OLD / "variant-config.json"  # the bundled organism by name
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
    debiaser = posdebias.Debiaser.load(
        state, posdebias.load_adapter("posdebias/organism", **options)
    )
    images = write_test_images(tmp_path / "images", 4)
    assert sorted(debiaser.rank("a red circle", images).order) == [0, 1, 2, 3]
    with pytest.raises(CalibrationError, match="another prompt"):
        posdebias.Debiaser.load(state, posdebias.load_adapter("posdebias/organism"))


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


GENERATED = json.loads((OLD / "generated-prompts.json").read_text())["cases"]


@pytest.mark.parametrize("case", GENERATED, ids=lambda c: json.dumps(c["fields"], sort_keys=True))
def test_generated_older_prompts_render_byte_for_byte(case):
    """120 older-form prompts drawn at random (a request in the middle or twice, whitespace
    around it, escaped braces in image prefixes, both layouts): every variant renders the
    messages the older prompt rendered and has its digest as the older one."""
    import hashlib

    template = task_template("retrieval", case["fields"])
    query = Instance(stem="a {red} cat", images=("a.png", "b.png", "c.png"), id="q")
    for key, (rendered, digest) in case["rendered"].items():
        name, label_set = key.split("/")
        varied = task_variant("retrieval", template, name, label_set)
        messages = varied.messages(query, get_label_set(label_set))
        shown = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        assert (shown[:16], (former_digest(varied) or "")[:16]) == (rendered, digest), key


def test_a_config_may_name_the_model_in_the_adapter_options(tmp_path, capsys):
    """The default run's bundled model is a default: a config naming its model in the adapter
    options runs that model (it crashed: two models), and one naming another model than
    --model is refused naming both."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"adapter": {"options": {"model": str(tmp_path / "none")}}}))
    argv = ["evaluate", "--config", str(config), *RUN, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
    config.write_text(json.dumps({"adapter": {"options": {"model": "posdebias/organism"}}}))
    assert main(argv) == 0  # the bundled model by its name, with its benchmark
    assert main([*argv[:-2], "--model", str(ORGANISM), "--out", str(tmp_path / "o")]) == 2
    assert "two models given" in capsys.readouterr().err


@pytest.mark.parametrize("value", [5, True, ["posdebias/organism"], {"id": "posdebias/organism"}])
def test_a_model_option_that_is_not_text_is_refused_naming_it(value, tmp_path, capsys):
    """The model a config names is one id or path: anything else is exit 2 naming the option,
    before a model is looked for (it reached the loader as a number or a list)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"adapter": {"options": {"model": value}}}))
    out = tmp_path / "out"
    assert main(["evaluate", "--config", str(config), *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "adapter option model: a model id or path (text)" in err and "Traceback" not in err
    assert not out.exists()


def test_a_refused_resume_names_the_setting_that_changed(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(OLD / "run", run)
    config = tmp_path / "config.json"
    options = {"model": "posdebias/organism", "prompt": {"query": "Caption: {caption}\nA:"}}
    config.write_text(json.dumps({"adapter": {"options": options}}))
    argv = ["evaluate", "--config", str(config), *RUN, "--out", str(run), "--resume"]
    assert main(argv) == 2
    message = capsys.readouterr().err
    assert "adapter.prompt.query: 'Caption: {caption}\\nAnswer:' there" in message
    assert "(dict)" not in message
