"""Model parallelism: a model split over devices gives the observations of the unsplit model.

A real split that runs on a CPU machine: accelerate's ``device_map`` with some language-model
layers offloaded to disk (their weights are loaded by accelerate's hooks for each forward), the
path a model too large for one device takes. The probe's per-device state (span matrix, the
half-precision scratch copy of the keys) and SoFA's per-device mask are exercised with a
``meta`` stand-in for a second device, where no numbers can be computed but every tensor must
stay on its own layer's device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posdebias import get_adapter
from posdebias.adapters.attention.probe import AttentionRecorder
from posdebias.adapters.attention.sofa import SofaSettings, sofa_attention, sofa_scope
from posdebias.adapters.hf.generation import GenerationSettings
from posdebias.testing import save_tiny_model

pytest.importorskip("accelerate")

FAMILIES = ("qwen2_vl", "internvl", "llava_onevision")


def split_map(model_dir, family):
    """Every language-model layer but the first on disk; the rest on the CPU."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_dir)
    with init_empty_weights():
        empty = AutoModelForImageTextToText.from_config(config)
    layers = [
        name
        for name, _ in empty.named_modules()
        if name.rsplit(".", 1)[-1].isdigit()
        and name.rsplit(".", 2)[-2] == "layers"
        and "language_model" in name
    ]
    assert len(layers) >= 2, layers
    offloaded = layers[1:]
    device_map = {name: "disk" for name in offloaded}
    for name, module in empty.named_modules():
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        if not own or any(name == o or name.startswith(o + ".") for o in offloaded):
            continue
        if any(o.startswith(name + ".") for o in offloaded):  # a parent of offloaded layers
            for tensor, _ in own:  # (LLaVA-OneVision's image_newline): its own tensors only
                device_map[f"{name}.{tensor}" if name else tensor] = "cpu"
        else:
            device_map[name] = "cpu"
    return device_map


@pytest.fixture(params=FAMILIES)
def pair(request, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    family = request.param
    folder = save_tiny_model(family, tmp_path / "model")
    processor = AutoProcessor.from_pretrained(folder)
    whole = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    device_map = split_map(folder, family)
    split = AutoModelForImageTextToText.from_pretrained(
        folder, dtype=torch.float32, device_map=device_map, offload_folder=str(tmp_path / "off")
    )
    assert "disk" in set(getattr(split, "hf_device_map", {}).values())
    return get_adapter(whole, processor), get_adapter(split, AutoProcessor.from_pretrained(folder))


def test_split_model_gives_the_observations_of_the_whole_model(pair, make_instances):
    whole, split = pair
    instances = make_instances(3, 4) + make_instances(1, 3, offset=5)
    expected = whole.observe_many(instances, batch_size=2)
    got = split.observe_many(instances, batch_size=2)
    for a, b in zip(expected, got, strict=True):
        assert np.max(np.abs(a.label_logprobs - b.label_logprobs)) < 1e-6
        assert np.max(np.abs(a.attention - b.attention)) < 1e-6


def test_split_model_decodes_samples_and_sofa_like_the_whole_model(pair, make_instances):
    whole, split = pair
    instances = make_instances(2, 3)
    sampled = GenerationSettings(max_new_tokens=4, do_sample=True, num_samples=3)
    assert [g.tokens for g in split.generate_many(instances, sampled, seeds=[1, 2])] == [
        g.tokens for g in whole.generate_many(instances, sampled, seeds=[1, 2])
    ]
    sofa = GenerationSettings(max_new_tokens=3, sofa=SofaSettings())
    assert [g.tokens for g in split.generate_many(instances, sofa)] == [
        g.tokens for g in whole.generate_many(instances, sofa)
    ]


def record_layers(devices, dtype=torch.bfloat16):
    """Probe records of 3 layers on ``devices`` (half precision: the scratch path)."""
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 4, 2, 9, 8
    spans = torch.zeros(batch, length, 3)
    spans[:, 1:3, 0] = spans[:, 3:6, 1] = spans[:, 6:8, 2] = 1
    recorder = AttentionRecorder(spans)
    for layer, device in enumerate(devices):
        query = torch.randn(batch, heads, length, dim, generator=generator).to(dtype)
        key = torch.randn(batch, kv_heads, length, dim, generator=generator).to(dtype)
        mask = torch.zeros(batch, 1, length, length).to(dtype)

        class Layer(torch.nn.Module):
            layer_idx = layer

        recorder.record(Layer(), query.to(device), key.to(device), mask.to(device), None)
    return recorder


def test_probe_keeps_span_matrix_and_scratch_per_device():
    alone = record_layers(["cpu", "cpu", "cpu"])
    mixed = record_layers(["cpu", "meta", "cpu"])  # layer 1 on a second device
    assert mixed.masses[1].device.type == "meta"
    for layer in (0, 2):  # the CPU layers are untouched by the other device's layer
        assert torch.equal(mixed.masses[layer], alone.masses[layer])
    assert {d.type for d in mixed._scratch} == {"cpu", "meta"}
    assert {d.type for d in mixed._spans} == {"cpu", "meta"}
    assert torch.equal(alone.attention(3), torch.stack([alone.masses[i] for i in range(3)], 1))


def test_sofa_mask_is_built_on_each_layer_device():
    from posdebias.adapters.attention.sofa import adjust_mask

    class Layer(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.layer_idx = index

    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    with sofa_attention(SofaSettings(layer_stride=1)), sofa_scope([[(1, 3), (3, 5)]], 6):
        for index, device in enumerate(["cpu", "meta", "cpu"]):
            query = torch.zeros(1, 2, 6, 4, device=device)
            adjusted = adjust_mask(Layer(index), query, query, mask)
            assert adjusted.device.type == device
