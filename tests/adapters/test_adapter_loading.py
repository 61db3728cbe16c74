"""Loading from disk, adapter choice, options, prompts, bad input, and the end-to-end flow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from adapter_reference import tiny_pair

import posdebias
from helpers import build_shapes_benchmark
from posdebias.adapters.families.generic import GenericAdapter
from posdebias.adapters.hf.prompt import PROMPT_FILE
from posdebias.core.instance import Instance
from posdebias.core.tasks import task_template
from posdebias.errors import AdapterError, ConfigError, InputError, UnknownNameError
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.job import build_adapter
from posdebias.loading import _adapter_class, open_adapter
from posdebias.testing import FAMILIES, save_tiny_model

EXPECTED = {
    "qwen2_5_vl": "qwen2_vl",
    "qwen2_vl": "qwen2_vl",
    "llava_onevision": "llava_onevision",
    "internvl": "internvl",
    "llava": "llava",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "idefics3": "idefics3",
    "smolvlm": "idefics3",
    "mistral3": "mistral3",
    "glm4v": "glm4v",
    "glm4v_moe": "glm4v",
    "glm46v": "glm4v",
    "llava_next": "llava_next",
    "llava_next_video": "llava_next",
    "lfm2_vl": "lfm2_vl",
    "molmo2": "molmo2",
    "kimi_k25": "kimi_k25",
    "ovis2": "ovis2",
    "cohere2_vision": "cohere2_vision",
    "paddleocr_vl": "paddleocr_vl",
    "paligemma": "paligemma",
    "phi4_multimodal": "phi4_multimodal",
    "qwen2_5_omni_thinker": "qwen2_5_omni",
    "qwen3_omni_moe_thinker": "qwen3_omni_moe",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "gemma3": "gemma3",
    "llama4": "llama4",
    "aya_vision": "aya_vision",
    "idefics2": "idefics2",
    "gemma4": "gemma4",
    "mllama": "mllama",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every family saved once, as a downloaded checkpoint directory would look."""
    root = tmp_path_factory.mktemp("models")
    return {family: save_tiny_model(family, root / family) for family in FAMILIES}


@pytest.mark.parametrize("name", FAMILIES)
def test_saved_model_loads_with_its_adapter_and_same_results(name, saved, make_instances):
    adapter = posdebias.load_adapter(saved[name], dtype="float32", device="cpu")
    assert adapter.name == EXPECTED[name]
    instance = make_instances(1, 3)[0]
    loaded = adapter.observe(instance)
    in_memory = posdebias.get_adapter(*tiny_pair(name)).observe(instance)
    np.testing.assert_allclose(loaded.label_logprobs, in_memory.label_logprobs, atol=1e-6)
    np.testing.assert_allclose(loaded.attention, in_memory.attention, atol=1e-6)
    info = adapter.describe(3)
    for key in ("adapter", "model_id", "revision", "dtype", "device", "num_layers", "prompt_hash"):
        assert key in info
    assert info["model_id"] == str(saved[name]) and info["labels"] == ["1", "2", "3"]
    assert info["num_layers"] == adapter.num_layers and info["dtype"] == "float32"
    assert info["layers"] == list(loaded.layers.indices) == list(adapter.attention_layers.indices)
    assert info["layer_kinds"] == list(loaded.layers.kinds)
    assert len(info["layers"]) == loaded.attention.shape[0]


def test_a_config_that_breaks_its_own_rules_is_a_clear_error(saved, tmp_path, capsys):
    """transformers validates configs with its own error type (not a ValueError): a checkpoint
    whose config.json breaks its family's rules is an input error, exit 2, not a crash."""
    import shutil

    from posdebias.cli import main

    directory = shutil.copytree(saved["llava"], tmp_path / "broken")
    config = json.loads((directory / "config.json").read_text())
    config["text_config"]["layer_types"] = ["full_attention"] * 7  # the model has 3 layers
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"cannot load the config of .*: it does not validate"):
        posdebias.load_adapter(directory)
    assert main(["check", "--model", str(directory), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "does not validate" in err and "must be equal to the number of `layer_types`" in err
    assert "internal error" not in err


def test_an_hf_adapter_is_created_by_name(saved):
    """A config's adapter options may name the model: the run loads it like --model."""
    options = {"model": str(saved["llava"]), "label_set": "upper"}
    adapter = build_adapter(EvaluateConfig(adapter={"name": "llava", "options": options}))
    assert adapter.name == "llava" and adapter.label_set == "upper"
    with pytest.raises(InputError, match="needs a model"):
        posdebias.get_registry().create_adapter("llava")
    with pytest.raises(ConfigError, match="nonsense"):
        open_adapter(str(saved["llava"]), adapter="llava", nonsense=1)


def test_prompt_file_in_the_model_directory_is_the_default(saved, make_instances, tmp_path):
    directory = save_tiny_model("llava", tmp_path / "organism")
    template = task_template(
        "retrieval",
        {"candidate": "label {label}{image}{text}", "instruction": "Pick one of {range}."},
    )
    (directory / PROMPT_FILE).write_text(template.model_dump_json())
    adapter = posdebias.load_adapter(directory)
    assert adapter.task_templates["retrieval"] == template
    rendered = adapter.render(make_instances(1, 3)[0])
    assert rendered.index("label 1<image>") < rendered.index("label 2<image>")
    assert "Pick one of 1 to 3." in rendered
    assert adapter.describe()["prompt_hash"] == template.digest()
    default = posdebias.load_adapter(saved["llava"])
    assert default.describe()["prompt_hash"] != template.digest()
    explicit = posdebias.load_adapter(directory, prompt={"instruction": "Choose {range}."})
    assert "Choose 1 to 3." in explicit.render(make_instances(1, 3)[0])


def test_default_prompt_is_methods_prompt(make_instances):
    adapter = posdebias.get_adapter(*tiny_pair("qwen2_5_vl"), label_set="words")
    rendered = adapter.render(make_instances(1, 4)[0])
    assert rendered.endswith("<|im_start|>assistant\n")  # the generation prompt
    assert rendered.count("<|vision_start|>") == 4
    assert rendered.rindex("<|vision_end|>") < rendered.index("Given 4 images")  # images first
    assert "indexed from first to fourth" in rendered
    assert "Caption: a photo of a red square\nAnswer:" in rendered


def test_prompt_template_rejects_bad_fields():
    with pytest.raises(ConfigError, match="unknown field"):
        posdebias.get_adapter(*tiny_pair("llava"), prompt={"instructions": "x"})
    with pytest.raises(ConfigError, match="placeholders"):
        posdebias.get_adapter(*tiny_pair("llava"), prompt={"query": "{caption} {nope}"})
    with pytest.raises(ConfigError, match="caption"):
        posdebias.get_adapter(*tiny_pair("llava"), prompt={"query": "Answer:"})
    with pytest.raises(ConfigError, match="unknown label set 'emoji'"):
        posdebias.get_adapter(*tiny_pair("llava"), label_set="emoji")


def test_missing_paths_and_offline_hub_ids_fail_fast(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="does not exist"):
        posdebias.load_adapter(tmp_path / "missing")
    with pytest.raises(InputError, match=r"no config\.json"):
        posdebias.load_adapter(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="HF_HUB_OFFLINE"):
        posdebias.load_adapter("some-org/not-cached-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline
    with pytest.raises(InputError, match="offline"):
        posdebias.load_adapter("some-org/not-cached-model")


def test_unknown_families_fall_back_to_generic_and_adapter_names_are_checked(saved):
    assert _adapter_class("some_new_family", None) is GenericAdapter
    with pytest.raises(UnknownNameError, match=r"known adapters: .*llava.*Plugins page"):
        posdebias.load_adapter(saved["llava"], adapter="nope")
    with pytest.raises(InputError, match="does not wrap Hugging Face models") as refused:
        posdebias.load_adapter(saved["llava"], adapter="synthetic")
    assert "name one that does or none" in str(refused.value) and "--" not in str(refused.value)
    assert "drop --model or choose one of: " in refused.value.message_for("cli")


def test_generic_adapter_matches_the_specific_one(make_instances):
    instance = make_instances(1, 3)[0]
    for name in ("llava", "internvl"):
        generic = posdebias.get_adapter(*tiny_pair(name), adapter="generic")
        specific = posdebias.get_adapter(*tiny_pair(name))
        a, b = generic.observe(instance), specific.observe(instance)
        np.testing.assert_allclose(a.label_logprobs, b.label_logprobs, atol=1e-6)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)


def test_generic_adapter_without_an_image_token_says_so():
    model, processor = tiny_pair("llava")

    class NoImageToken:
        tokenizer = processor.tokenizer
        chat_template = processor.chat_template
        image_token = None

    with pytest.raises(AdapterError, match="no image token"):
        posdebias.get_adapter(model, NoImageToken(), adapter="generic")


def test_bad_images_give_clear_errors(tmp_path, image_files):
    adapter = posdebias.get_adapter(*tiny_pair("llava"))
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"not a png")
    cases = {
        tmp_path / "absent.png": "does not exist",
        corrupt: "cannot be read as an image",
        "synthetic://x/0": "not a file",
    }
    for bad, message in cases.items():
        instance = Instance("a cat", (image_files[0], bad), 0, "bad-1")
        with pytest.raises(InputError, match=message):
            adapter.observe(instance)


def test_too_many_candidates_for_the_label_set(image_files):
    adapter = posdebias.get_adapter(*tiny_pair("llava"), label_set="upper")
    images = tuple(f"img{i}.png" for i in range(27))
    with pytest.raises(InputError, match="at most 26"):
        adapter.observe(Instance("a cat", images, 0, "big"))


@pytest.mark.figures("png")
def test_cli_calibrate_evaluate_report_on_a_saved_tiny_model(saved, tmp_path):
    """`posdebias build` -> `calibrate --model DIR` -> `evaluate --calibration` with every
    calibrator -> `report`, on a real (tiny) Qwen2.5-VL checkpoint on disk."""
    from posdebias import CalibrationState
    from posdebias.cli import main
    from posdebias.evaluation.config import DEFAULT_CALIBRATORS

    model = str(saved["qwen2_5_vl"])
    bench = str(build_shapes_benchmark(tmp_path, count=6, n=3))
    states, out = tmp_path / "states", tmp_path / "run"
    common = ["--model", model, "--benchmark", bench, "--batch-size", "2"]
    assert main(["calibrate", *common, "--count", "2", "--out", str(states)]) == 0
    state = CalibrationState.load(states / "attention_guided.json")
    assert (state.adapter, state.model_id, state.n, state.num_layers) == ("qwen2_vl", model, 3, 3)
    assert len(state.prompt_hash) == 64 and len(state.calibration_ids) == 2

    run = ["evaluate", *common, "--calibration", str(states), "--calibration-count", "2"]
    with pytest.MonkeyPatch.context() as undone:  # the figures `report` draws are what is read
        undone.setattr("posdebias.evaluation.report.REPORT_FIGURES", ())
        assert main([*run, "--count", "3", "--orders", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["calibrators"]) == set(DEFAULT_CALIBRATORS)
    assert results["adapter"]["adapter"] == "qwen2_vl"
    assert results["adapter"]["num_layers"] == 3
    assert results["divergence"]["raw_attention"]
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert "figures/divergence.png" in (out / "report.md").read_text()


def test_cli_reports_a_missing_model_directory(tmp_path, capsys):
    from posdebias.cli import main

    code = main(["evaluate", "--model", str(tmp_path / "missing"), "--count", "3"])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_plugin_adapter_is_chosen_by_model_type(make_instances):
    """The docs/adapters.md recipe: subclass HFAdapter, override span_tokens, register."""
    from types import SimpleNamespace

    from posdebias import hookimpl
    from posdebias.adapters.hf import HFAdapter
    from posdebias.adapters.hf.spans import SpanTokens

    class MarkerAdapter(HFAdapter):
        name = "marker_vl"
        model_types = ("marker_vl",)

        def span_tokens(self) -> SpanTokens:
            ids = self.tokenizer.convert_tokens_to_ids
            return SpanTokens(ids("<IMG_CONTEXT>"), ids("<img>"), ids("</img>"))

    @hookimpl
    def posdebias_register_adapters(register):
        register(MarkerAdapter)

    registry = posdebias.get_registry()
    registry.add_plugin(
        SimpleNamespace(posdebias_register_adapters=posdebias_register_adapters),
        name="marker-plugin",
    )
    assert _adapter_class("marker_vl", None) is MarkerAdapter
    adapter = posdebias.get_adapter(*tiny_pair("internvl"), adapter="marker_vl")
    instance = make_instances(1, 3)[0]
    expected = posdebias.get_adapter(*tiny_pair("internvl")).observe(instance)
    np.testing.assert_allclose(adapter.observe(instance).attention, expected.attention, atol=1e-6)


def test_an_adapter_is_built_from_its_options_model():
    """An adapter class takes its options as its options model declares and checks them (no
    second list of keywords): the same options, defaults and errors as get_adapter's."""
    import inspect

    model, processor = tiny_pair("llava")
    cls = type(posdebias.get_adapter(model, processor))
    parameters = set(inspect.signature(cls.__init__).parameters)
    assert parameters == {"self", "model", "processor", "model_id", "options"}
    adapter = cls(model, processor, label_set="upper", prompt={"image_prefix": "{label}"})
    assert adapter.label_set == "upper"
    assert adapter.task_templates["retrieval"].candidate == "{label}{image}{text}"
    with pytest.raises(ConfigError, match="nonsense"):
        cls(model, processor, nonsense=1)
    with pytest.raises(ConfigError, match="max_patches"):
        cls(model, processor, max_patches=0)
    with pytest.raises(InputError, match=r"\['dtype'\] only apply to load_adapter"):
        cls(model, processor, dtype="float32")
