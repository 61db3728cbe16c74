"""The attention probe against eager attention maps, per family, with left padding."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from adapter_reference import eager_masses, forward, fresh_model, language_model, tiny_pair
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posdebias import get_adapter
from posdebias.adapters.attention import PROBE_NAME, recording
from posdebias.adapters.hf.spans import span_matrix


def test_probe_rows_equal_eager_last_rows_with_left_padding(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    instances = make_instances(2, 3)
    batch = adapter.prepare_batch(instances)
    padding = (batch.inputs["attention_mask"] == 0).sum(dim=1)
    assert padding[0] > 0 and padding[1] == 0, "the batch must exercise left padding"
    _, attention = adapter.run_batch(batch)
    reference = eager_masses(family, batch)
    assert attention.shape == (2, len(adapter.attention_layers), 3)
    assert torch.max(torch.abs(attention.double() - reference)) < 1e-5
    # The padded row alone (no padding) gives the same masses.
    _, alone = adapter.run_batch(adapter.prepare_batch(instances[:1]))
    assert torch.max(torch.abs(alone[0] - attention[0])) < 1e-5


def test_logits_with_probe_equal_plain_sdpa_exactly(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    batch = adapter.prepare_batch(make_instances(2, 3))
    plain = fresh_model(family, "sdpa")
    length = batch.inputs["input_ids"].shape[1]
    cross = adapter.cross_attention_spans(batch)
    with torch.no_grad():
        expected = forward(family, plain, **batch.inputs, position_ids=batch.position_ids).logits
        with recording(span_matrix(batch.spans, length), cross) as recorder:
            probed = adapter.model_forward(**batch.inputs, position_ids=batch.position_ids).logits
    assert recorder.recorded_layers == list(adapter.attention_layers.indices)
    real = batch.inputs["attention_mask"].bool()
    assert torch.equal(probed[real], expected[real])


def test_only_the_language_model_is_probed(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    model = adapter.model
    assert model.config.get_text_config()._attn_implementation == PROBE_NAME
    vision = model.config.vision_config
    assert vision._attn_implementation != PROBE_NAME
    batch = adapter.prepare_batch(make_instances(1, 2))
    length = batch.inputs["input_ids"].shape[1]
    cross = adapter.cross_attention_spans(batch)
    with torch.no_grad(), recording(span_matrix(batch.spans, length), cross) as recorder:
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)
    language_modules = {id(module) for module in language_model(model).modules()}
    assert recorder.recorded_layers == list(adapter.attention_layers.indices)
    assert all(id(module) in language_modules for module in recorder.modules.values())


def test_recorder_is_scoped_to_its_context(make_instances):
    adapter = get_adapter(*tiny_pair("llava"))
    batch = adapter.prepare_batch(make_instances(1, 2))
    length = batch.inputs["input_ids"].shape[1]
    matrix = span_matrix(batch.spans, length)

    def forward():
        with torch.no_grad():
            adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)

    with recording(matrix) as outer:
        thread = threading.Thread(target=forward)  # a new thread starts with no recorder
        thread.start()
        thread.join()
        assert outer.masses == {}
        with recording(matrix) as inner:
            forward()
        assert len(inner.masses) == adapter.num_layers and outer.masses == {}
        forward()
    assert len(outer.masses) == adapter.num_layers
    forward()  # outside any recording: plain SDPA, nothing recorded anywhere
    assert len(outer.masses) == adapter.num_layers


def test_attention_masses_are_probabilities(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    observation = adapter.observe(make_instances(1, 4)[0])
    layers = adapter.attention_layers
    assert observation.layers == layers
    assert observation.attention.shape == (len(layers), 4)
    assert (observation.attention[layers.rows_of_kinds(["global"])] > 0).all()
    assert (observation.attention >= 0).all()
    assert (observation.attention.sum(axis=1) < 1 + 1e-6).all()


class _QuadraticTensors(TorchDispatchMode):
    """Counts every tensor an operator produces whose last two dimensions are both >= T."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length
        self.found: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            big = isinstance(value, torch.Tensor) and value.dim() >= 2
            if big and min(value.shape[-2:]) >= self.length:
                self.found.append((str(func), tuple(value.shape)))
        return out


def _quadratic(adapter, batch, length: int, *, probe: bool) -> list[tuple[str, tuple[int, ...]]]:
    record = recording(span_matrix(batch.spans, length)) if probe else contextlib.nullcontext()
    with torch.no_grad(), record, _QuadraticTensors(length) as seen:
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)
    return seen.found


@pytest.mark.parametrize("family_name", ["qwen2_5_vl"])
def test_probe_memory_has_no_quadratic_tensor(family_name, make_instances):
    """The probe adds no T x T tensor to the forward pass (only O(layers x batch x N) numbers),
    measured on every operator output; the same detector sees eager attention's T x T map."""
    adapter = get_adapter(*tiny_pair(family_name))
    batch = adapter.prepare_batch(make_instances(2, 4))
    length = batch.inputs["input_ids"].shape[1]
    without = _quadratic(adapter, batch, length, probe=False)
    with_probe = _quadratic(adapter, batch, length, probe=True)
    assert sorted(with_probe) == sorted(without)  # the model's own mask, nothing more
    with torch.no_grad(), recording(span_matrix(batch.spans, length)) as recorder:
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)
    assert all(mass.shape == (2, 4) for mass in recorder.masses.values())
    # positive control: eager attention materialises [B, heads, T, T] weights, and we see them
    eager = get_adapter(*tiny_pair(family_name))
    eager.model.set_attn_implementation("eager")
    weights = [s for _, s in _quadratic(eager, batch, length, probe=False) if len(s) == 4]
    assert any(s[0] == 2 and s[1] > 1 and s[-2:] == (length, length) for s in weights)


def test_half_precision_keys_are_upcast_in_chunks_exactly():
    from posdebias.adapters.attention.probe import KEY_CHUNK, AttentionRecorder

    length = 2 * KEY_CHUNK + 37  # two full chunks and a partial one
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(2, 2, length, 16, generator=generator).to(torch.bfloat16)
    q_last = torch.randn(2, 2, 3, 16, generator=generator)
    recorder = AttentionRecorder(torch.zeros(2, length, 4))
    scores = recorder._last_row_scores(q_last, key)
    expected = torch.matmul(q_last.double(), key.double().transpose(-1, -2))
    assert scores.dtype == torch.float32
    assert torch.max(torch.abs(scores.double() - expected)) < 1e-4
    assert recorder._scratch[key.device].shape[2] == KEY_CHUNK  # one scratch per device


def test_a_layer_with_the_last_queries_only_is_read_and_a_decoding_step_refused():
    """A prompt-pass layer may compute only the last queries (Gemma 4's KV-shared layers): its
    last row is the last token's, read as from the full pass. A decoding step (more keys than
    the prompt) is refused, never read as the prompt's row."""
    from types import SimpleNamespace

    from posdebias.adapters.attention.probe import AttentionRecorder
    from posdebias.errors import AdapterError

    generator = torch.Generator().manual_seed(0)
    length, heads, dim = 7, 4, 8
    query = torch.randn(1, heads, length, dim, generator=generator)
    key = torch.randn(1, 2, length, dim, generator=generator)
    spans = span_matrix([[(1, 3), (3, 6)]], length)
    full, last = AttentionRecorder(spans), AttentionRecorder(spans)
    full.record(SimpleNamespace(layer_idx=0), query, key, None, None)
    last.record(SimpleNamespace(layer_idx=0), query[:, :, -1:], key, None, None)
    assert torch.equal(full.attention(1), last.attention(1))
    longer = torch.randn(1, 2, length + 1, dim, generator=generator)
    with pytest.raises(AdapterError, match="1 queries over 8 keys.*record only the prompt"):
        last.record(SimpleNamespace(layer_idx=1), query[:, :, -1:], longer, None, None)


def test_soft_capped_layers_equal_transformers_eager_and_sinks_are_refused():
    """The attention function's capped output equals Gemma 2's own eager attention (grouped
    heads, a padding mask) and its probe row caps too; attention sinks stop with an error
    instead of being dropped."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from posdebias.adapters.attention import attention_forward
    from posdebias.errors import AdapterError

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 5, 8, generator=generator) * 3
    key, value = (torch.randn(2, 2, 5, 8, generator=generator) * 3 for _ in range(2))
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    allowed[0, :, :, :2] = False  # row 0 left padded by two tokens
    allowed[0, :, :2, :2] = torch.eye(2, dtype=torch.bool)  # (pad rows see themselves)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx = 2, 0
    module.training = False
    expected, weights = eager_attention_forward(
        module, query, key, value, additive, scaling=0.5, softcap=2.0
    )
    spans = torch.zeros(2, 5, 1)
    spans[:, 2:4, 0] = 1.0
    with recording(spans) as recorder:
        output, _ = attention_forward(module, query, key, value, allowed, scaling=0.5, softcap=2.0)
    assert torch.allclose(output, expected, atol=1e-6)
    mass = weights[:, :, -1, 2:4].sum(dim=-1).mean(dim=1)  # last row, heads averaged
    assert torch.allclose(recorder.masses[0][:, 0], mass, atol=1e-6)
    with pytest.raises(AdapterError, match="attention sinks"):
        attention_forward(module, query, key, value, allowed, s_aux=torch.zeros(4))
