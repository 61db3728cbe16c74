"""Mllama (Llama 3.2 Vision): images read through cross-attention layers, and the probe there.

An observation of Mllama has one row per cross-attention layer: the last prompt token's
cross-attention probability on each image's encoder tokens, averaged over heads. These tests
hold it to eager cross-attention computed independently (the model's own attention maps, the
encoder's token layout rebuilt from the pixel tensor and the vision config).
"""

from __future__ import annotations

import pytest
import torch
from adapter_reference import encoder_span_matrix, fresh_model, tiny_pair

from posdebias import get_adapter
from posdebias.adapters.attention import recording
from posdebias.adapters.hf.spans import span_matrix
from posdebias.core.layers import LayerSet
from posdebias.errors import AdapterError
from posdebias.testing.check import check_adapter, check_instances
from posdebias.testing.tiny.mllama import TINY_CROSS_ATTENTION_LAYERS


def _eager(batch):
    model = fresh_model("mllama", "eager")
    with torch.no_grad():
        output = model(**batch.inputs, position_ids=batch.position_ids, output_attentions=True)
    return model, output.attentions


def test_probe_equals_eager_cross_attention(make_instances):
    """Left-padded batch of two, images of different tile counts: each row's masses equal the
    eager cross-attention maps' last row summed over each image's encoder tokens (1e-5); the
    rows are probabilities over the images (every key is some image's; padding tiles get 0)."""
    adapter = get_adapter(*tiny_pair("mllama"))
    instances = check_instances(4, multi_token_n=None)  # 56 to 112 px: 1, 2 or 4 tiles each
    batch = adapter.prepare_batch(instances[:2])
    assert (batch.inputs["attention_mask"] == 0).any(), "the batch must be left padded"
    _, masses = adapter.run_batch(batch)
    model, maps = _eager(batch)
    length = batch.inputs["input_ids"].shape[1]
    assert len(maps) == model.config.text_config.num_hidden_layers  # one map per layer
    spans = encoder_span_matrix(model, batch).double()
    for row, layer in enumerate(TINY_CROSS_ATTENTION_LAYERS):
        cross = maps[layer][:, :, -1, :].double().mean(dim=1)  # [B, encoder tokens]
        assert cross.shape[1] == spans.shape[1] != length  # keys: the encoder's, not the prompt
        eager = torch.bmm(cross[:, None, :], spans)[:, 0]
        assert torch.max(torch.abs(masses[:, row].double() - eager)) < 1e-5
        tiles = batch.inputs["cross_attention_mask"][:, -1]  # [B, images, tiles] 1 = a real tile
        padding = (tiles == 0).repeat_interleave(spans.shape[1] // tiles[0].numel(), dim=-1)
        assert padding.any() and float(cross[padding.reshape(cross.shape)].abs().max()) == 0.0
    assert torch.allclose(masses.sum(dim=-1).double(), torch.ones(2, 2, dtype=torch.float64))


def test_cross_attention_reaches_the_probe_through_the_attention_interface(make_instances):
    """transformers routes Mllama's cross-attention through ALL_ATTENTION_FUNCTIONS too: the
    recorder is called by the cross-attention modules of the observed layers, and the
    self-attention layers (placeholders only) are not read."""
    adapter = get_adapter(*tiny_pair("mllama"))
    batch = adapter.prepare_batch(make_instances(1, 3))
    length = batch.inputs["input_ids"].shape[1]
    cross = adapter.cross_attention_spans(batch)
    with torch.no_grad(), recording(span_matrix(batch.spans, length), cross) as recorder:
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)
    assert recorder.recorded_layers == TINY_CROSS_ATTENTION_LAYERS
    kinds = {type(module).__name__ for module in recorder.modules.values()}
    assert kinds == {"MllamaTextCrossAttention"}
    prompt_only = recording(span_matrix(batch.spans, length))  # no cross-attention spans
    with torch.no_grad(), prompt_only, pytest.raises(AdapterError, match=r"over \d+ keys"):
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)


def test_the_observation_names_the_cross_attention_layers(make_instances):
    adapter = get_adapter(*tiny_pair("mllama"))
    observation = adapter.observe(make_instances(1, 3)[0])
    expected = LayerSet(tuple(TINY_CROSS_ATTENTION_LAYERS), ("global", "global"))
    assert adapter.attention_layers == observation.layers == expected
    assert observation.attention.shape == (2, 3)
    described = adapter.describe()
    assert described["layers"] == TINY_CROSS_ATTENTION_LAYERS and described["num_layers"] == 4


def test_images_between_texts_are_seen_until_the_next_image(make_instances):
    """The processor's cross-attention mask lets a token see the images of the last group of
    placeholders before it: with a text between the images, the last prompt token sees the last
    image only (mass 1 on it, 0 on the others) - the model's own behaviour, not a reading."""
    model, processor = tiny_pair("mllama")
    adapter = get_adapter(model, processor, prompt={"image_prefix": "Image {label}: "})
    observation = adapter.observe(make_instances(1, 3)[0])
    assert observation.attention[:, :2].max() == 0.0
    assert abs(observation.attention[:, 2] - 1.0).max() < 1e-6


def test_sofa_and_text_candidates_are_refused(make_instances):
    from posdebias.decoders import Sofa

    adapter = get_adapter(*tiny_pair("mllama"))
    with pytest.raises(AdapterError, match="cross-attention layers.*SoFA does not apply"):
        Sofa().decide(adapter, make_instances(1, 3), seeds=[0])
    question = check_instances(3, task="multiple_choice", with_images=True)[0]
    with pytest.raises(AdapterError, match="cross-attention.*use retrieval instances"):
        adapter.observe(question)
    calls = [0]
    adapter.model.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    with pytest.raises(AdapterError, match="a multiple_choice instance has text candidates"):
        check_adapter(adapter, task="multiple_choice")  # refused before the table
    assert calls[0] == 0
