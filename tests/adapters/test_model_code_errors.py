"""An exception raised by a model's own code (its processor, its forward) is reported as the
model's: the family, the call, the error and what to try, exit 2 or a FAIL row in `check`,
never "internal error ... please report it"."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import build_shapes_benchmark
from posdebias import get_adapter
from posdebias.cli import main
from posdebias.errors import ModelCodeError
from posdebias.testing import check_adapter, save_tiny_model, tiny_model_and_processor
from posdebias.testing.check import check_instances


@pytest.fixture(scope="module")
def broken_processor(tmp_path_factory):
    """A tiny Idefics3 (Granite-Docling's family) whose saved image processor lacks a key its
    own code reads: transformers raises KeyError: 'longest_edge' when it prepares an image."""
    folder = save_tiny_model("idefics3", tmp_path_factory.mktemp("models") / "idefics3")
    config = folder / "processor_config.json"
    payload = json.loads(config.read_text())
    payload["image_processor"]["max_image_size"] = {"height": 64}
    config.write_text(json.dumps(payload))
    return folder


def test_check_reports_a_processor_error_as_the_models_in_fail_rows(broken_processor, capsys):
    assert main(["check", "--model", str(broken_processor), "-N", "2"]) == 1
    captured = capsys.readouterr()
    assert "internal error" not in captured.err and "please report" not in captured.err
    out = " ".join(re.sub("[\u2500-\u257f]", " ", captured.out).split())  # table rules out
    assert "FAIL" in out and "KeyError" in out and "family idefics3" in out
    assert "the model's processor" in out and "This is the model's own code" in out


def test_evaluate_reports_a_processor_error_as_the_models_exit_2(
    broken_processor, tmp_path, capsys
):
    bench = build_shapes_benchmark(tmp_path / "b", count=4, n=3)
    capsys.readouterr()
    out = tmp_path / "run"
    args = ["evaluate", "--model", str(broken_processor), "--benchmark", str(bench)]
    code = main([*args, "--count", "2", "--calibration-count", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "internal error" not in err and "please report" not in err
    assert "the model's processor" in err and "KeyError: 'longest_edge'" in err
    assert "family idefics3" in err and "transformers" in err


class _Failing(Exception):
    pass


@pytest.mark.parametrize("error", [KeyError("rows"), RuntimeError("shape mismatch"), _Failing()])
def test_a_forward_that_raises_is_the_models_error(error):
    model, processor = tiny_model_and_processor("qwen2_vl", seed=0)

    def forward(*args, **kwargs):  # a checkpoint's own (remote) code that fails
        raise error

    model.forward = forward
    adapter = get_adapter(model, processor)
    instance = check_instances(2)[0]
    with pytest.raises(ModelCodeError) as caught:
        adapter.observe(instance)
    message = str(caught.value)
    assert f"the model's forward raised {type(error).__name__}" in message
    assert "family qwen2_vl" in message and "not posdebias" in message
    assert caught.value.exit_code == 2
    report = check_adapter(adapter)
    failed = [r for r in report.results if r.status == "FAIL"]
    assert failed and all("the model's forward raised" in r.cause for r in failed), report.summary()


def test_errors_of_posdebias_own_code_inside_the_forward_stay_ours():
    # an exception whose innermost frame is posdebias's (the attention probe, a hook) or an
    # adapter class's own module (a plugin's family) is not blamed on the model
    from posdebias.adapters.hf import HFAdapter
    from posdebias.adapters.hf.adapter import _raised_in_posdebias

    def ours():
        raise ValueError("ours")

    class PluginFamily(HFAdapter):  # defined in this file: its errors here are the plugin's
        pass

    try:
        ours()
    except ValueError as exc:
        assert not _raised_in_posdebias(exc, HFAdapter)  # a test file, outside the package
        assert _raised_in_posdebias(exc, PluginFamily)
    try:
        torch.zeros(2) @ torch.zeros(3)
    except RuntimeError as exc:
        assert not _raised_in_posdebias(exc, HFAdapter)
    from posdebias.core.observation import Observation

    try:
        Observation(label_logprobs=[float("nan"), 0.0])
    except Exception as exc:
        assert _raised_in_posdebias(exc, HFAdapter)


def test_a_plugin_familys_own_forward_is_its_code_and_the_model_inside_it_the_models():
    from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter

    model, processor = tiny_model_and_processor("qwen2_vl", seed=0)
    instance = check_instances(2)[0]

    class Buggy(Qwen2VLAdapter):
        def own_forward(self, **inputs):
            return self.modle(**inputs)  # the plugin's own bug

    with pytest.raises(AttributeError, match="modle"):  # the plugin's, not "the model's"
        Buggy(model, processor).observe(instance)

    class Checked(Qwen2VLAdapter):
        def own_forward(self, **inputs):
            return self.model(**inputs)

    # the checkpoint's own (remote) code, in a file of its own, fails inside the plugin's forward
    model.forward = eval(compile("lambda *args, **kwargs: {}['rows']", "modeling_x.py", "eval"))
    with pytest.raises(ModelCodeError, match="the model's forward raised KeyError"):
        Checked(model, processor).observe(instance)


def test_a_familys_own_position_ids_or_tokenizer_failing_is_the_models_error():
    """Qwen2-VL's positions come from the model's own get_rope_index, a text family's tokens
    from its tokenizer alone (its own processor_inputs): both are the model's code."""
    model, processor = tiny_model_and_processor("qwen2_vl", seed=0)

    def rope_index(*args, **kwargs):
        raise IndexError("grid")

    model.model.get_rope_index = rope_index
    with pytest.raises(ModelCodeError, match="the model's position ids raised IndexError"):
        get_adapter(model, processor).observe(check_instances(2)[0])

    adapter = get_adapter(*tiny_model_and_processor("qwen3", seed=0), label_set="upper")

    tokenizer = adapter.tokenizer

    def tokenize(*args, **kwargs):  # the batch's padded tokens: the family's processor_inputs
        if kwargs.get("padding"):
            raise KeyError("merges")
        return tokenizer(*args, **kwargs)

    adapter.tokenizer = tokenize
    text = check_instances(2, task="multiple_choice", with_images=False)[0]
    with pytest.raises(ModelCodeError, match="the model's processor .* raised KeyError"):
        adapter.observe(text)


@pytest.mark.parametrize(
    ("family", "part"),
    [
        # the model's forward checked first, then run (a vision tower hooked apart is refused)
        ("phi4_multimodal", lambda model: model),
        # transformers' own forward cannot run: the adapter composes it from the model's parts
        ("llama4", lambda model: model.language_model),
    ],
)
def test_a_family_that_runs_its_own_forward_still_reports_the_models_error(family, part):
    model, processor = tiny_model_and_processor(family, seed=0)

    def forward(*args, **kwargs):  # the checkpoint's own code fails inside the family's forward
        raise KeyError("rows")

    part(model).forward = forward
    adapter = get_adapter(model, processor)
    with pytest.raises(ModelCodeError) as caught:
        adapter.observe(check_instances(2)[0])
    message = str(caught.value)
    assert "the model's forward raised KeyError" in message and "not posdebias" in message
    assert f"family {family}" in message and caught.value.exit_code == 2


def test_a_processor_refusing_its_input_is_still_the_inputs_problem():
    """A ValueError of the processor says the prompt or its images are refused (the family
    coverage table shows such refusals): an AdapterError naming it, not the model's error."""
    from posdebias.errors import AdapterError

    model, processor = tiny_model_and_processor("qwen2_vl", seed=0)
    adapter = get_adapter(model, processor)
    processor_class = type(adapter.processor)
    refuse = eval(  # in a file of its own, as transformers' code is
        compile("lambda *args, **kwargs: int('two images')", "processing_x.py", "eval")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processor_class, "__call__", refuse)
        with pytest.raises(AdapterError, match="rejected the prompt and its images") as caught:
            adapter.observe(check_instances(2)[0])
    assert not isinstance(caught.value, ModelCodeError)


@pytest.mark.parametrize("door", ["score", "generate"])
def test_a_generation_config_whose_processors_fail_is_the_models_error(door):
    """The checkpoint's generation-config logits processors (``logits_processors:
    generation_config``) are the model's code: a broken setting of its generation config
    fails there, in label scoring as in generation."""
    from posdebias.adapters.base import GenerationSettings

    model, tokenizer = tiny_model_and_processor("qwen3", seed=0)
    model.generation_config.repetition_penalty = -1.0  # a penalty must be a positive float
    adapter = get_adapter(
        model, tokenizer, label_set="upper", logits_processors="generation_config"
    )
    question = check_instances(2, task="multiple_choice", with_images=False)[0]
    with pytest.raises(ModelCodeError, match="the model's generation-config logits processors"):
        if door == "score":
            adapter.observe(question)
        else:
            adapter.generate_many([question], GenerationSettings(max_new_tokens=2))
