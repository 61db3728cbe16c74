"""Phi-4-multimodal: a causal LM whose image path is a LoRA of its language model, merged from
the checkpoint's ``vision-lora/`` folder at load; its output-capture hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_reference import tiny_pair

import posdebias
from posdebias import get_adapter
from posdebias.adapters.attention import language_model_attention
from posdebias.adapters.families import phi4_multimodal
from posdebias.errors import AdapterError, InputError
from posdebias.testing import check_adapter, save_tiny_model, tiny_model_and_processor
from posdebias.testing.check import check_instances

#: The language model's attention and MLP projections, as the checkpoints' vision LoRA.
_LORA_TARGETS = r"model\.layers\.\d+\.(self_attn\.(qkv_proj|o_proj)|mlp\.(gate_up_proj|down_proj))"


@pytest.fixture(scope="module")
def with_lora(tmp_path_factory):
    """A saved tiny Phi-4-multimodal with a random vision LoRA in ``vision-lora/``."""
    from peft import LoraConfig, get_peft_model

    directory = save_tiny_model("phi4_multimodal", tmp_path_factory.mktemp("phi4") / "model")
    model, _ = tiny_model_and_processor("phi4_multimodal")
    tuned = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=_LORA_TARGETS))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # PEFT starts lora_B at zero (no effect): make the LoRA matter
        for name, parameter in tuned.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    tuned.save_pretrained(directory / "vision-lora")
    return directory, tuned


def test_the_vision_lora_is_merged_and_read(with_lora, make_instances):
    """load_adapter merges the checkpoint's vision LoRA: the scores are the LoRA model's (not
    the base weights'), describe() says so, and every check passes on the merged model."""
    directory, tuned = with_lora
    adapter = posdebias.load_adapter(directory, dtype="float32", device="cpu")
    assert adapter.name == "phi4_multimodal"
    assert adapter.describe(3)["vision_lora"] == "merged from vision-lora/"
    instance = make_instances(1, 3)[0]
    batch = adapter.prepare_batch([instance])
    with torch.no_grad():
        merged = adapter.model_forward(**batch.inputs).logits[0, -1]
        expected = tuned(**batch.inputs).logits[0, -1]  # the LoRA model itself, unmerged
        base = tiny_pair("phi4_multimodal")[0](**batch.inputs).logits[0, -1]
    assert torch.max(torch.abs(merged - expected)) < 1e-4
    assert torch.max(torch.abs(merged - base)) > 1e-2
    report = check_adapter(adapter, check_instances(3, multi_token_n=None))
    assert report.passed, report.summary()
    assert get_adapter(*tiny_pair("phi4_multimodal")).describe(3)["vision_lora"] is None


def test_a_vision_lora_without_peft_is_a_clear_error(with_lora, monkeypatch):
    monkeypatch.setattr(phi4_multimodal, "find_spec", lambda name: None)
    with pytest.raises(InputError, match=r"vision LoRA \(vision-lora/\).*pip install peft"):
        posdebias.load_adapter(with_lora[0], dtype="float32", device="cpu")


def test_a_model_run_before_it_was_wrapped_refuses_attention_maps(make_instances):
    """transformers hooks the vision tower's outputs on its first forward; hooking the
    language model's afterwards hooks the tower twice and selects the wrong features. The
    adapter hooks the whole model first when it can; otherwise attention maps are refused,
    while the probe and scores (which need no maps) are unaffected."""
    model, processor = tiny_model_and_processor("phi4_multimodal")
    instance = make_instances(1, 3)[0]
    fresh = get_adapter(*tiny_model_and_processor("phi4_multimodal")).observe(instance)
    batch = get_adapter(model, processor).prepare_batch([instance])  # hooks the whole model
    model2, processor2 = tiny_model_and_processor("phi4_multimodal")
    with torch.no_grad():
        model2(**batch.inputs)  # a forward before posdebias wraps it
    adapter = get_adapter(model2, processor2)
    observed = adapter.observe(instance)
    np.testing.assert_allclose(observed.label_logprobs, fresh.label_logprobs, atol=1e-6)
    np.testing.assert_allclose(observed.attention, fresh.attention, atol=1e-6)
    with pytest.raises(AdapterError, match="ran before posdebias wrapped it"):
        adapter.model_forward(**batch.inputs, output_attentions=True)
    wrapped = get_adapter(model, processor)  # wrapped before its first forward
    with torch.no_grad():
        plain = model(**batch.inputs).logits
        model.set_attn_implementation(language_model_attention(model, None, "eager"))
        maps = wrapped.model_forward(**batch.inputs, output_attentions=True)
    assert len(maps.attentions) == model.config.num_hidden_layers  # eager maps, and the
    assert torch.allclose(maps.logits, plain, atol=1e-5)  # features of the right layer
