"""Hybrid and windowed language models: Qwen3.5 (linear + full attention), Gemma 3 (sliding +
global, bidirectional image blocks), Llama 4 (chunked + global NoPE).

The family-wide tests (probe = eager attention, scores = full re-forwards, batch 1 = batch 2)
run on these families too (FAMILIES); here: the layer sets, windows that cut through the
prompt, the masks the probe applies, and the refusals.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from adapter_reference import eager_masses, language_model, tiny_pair

from helpers import build_shapes_benchmark
from posdebias import get_adapter, get_calibrator
from posdebias.adapters.attention import recording
from posdebias.adapters.hf.spans import span_matrix
from posdebias.core.instance import Instance
from posdebias.core.layers import LayerSet
from posdebias.errors import AdapterError, CalibrationError
from posdebias.testing import save_tiny_model
from posdebias.testing.tiny.llama4 import TINY_CHUNK_SIZE

HYBRID = ("qwen3_5", "qwen3_5_moe", "gemma3", "llama4", "gemma4")
G, S, C = "global", "sliding", "chunked"
EXPECTED_LAYERS = {
    # linear x3, full; linear x3, full: only the full-attention layers have rows
    "qwen3_5": ((3, 7), (G, G)),
    "qwen3_5_moe": ((3, 7), (G, G)),
    # five sliding, one global, twice
    "gemma3": (tuple(range(12)), (S, S, S, S, S, G, S, S, S, S, S, G)),
    # three chunked RoPE layers, one global NoPE layer, twice
    "llama4": (tuple(range(8)), (C, C, C, G, C, C, C, G)),
    # two sliding, one global, twice; the last two layers reuse layers 3 (sliding) / 2 (global)
    "gemma4": (tuple(range(6)), (S, S, G, S, S, G)),
}


@pytest.mark.parametrize("family", HYBRID)
def test_attention_layers_follow_the_family_pattern(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    indices, kinds = EXPECTED_LAYERS[family]
    assert adapter.attention_layers == LayerSet(indices, kinds)
    observation = adapter.observe(make_instances(1, 3)[0])
    assert observation.layers == adapter.attention_layers
    assert observation.attention.shape == (len(indices), 3)
    described = adapter.describe()
    assert described["layers"] == list(indices) and described["layer_kinds"] == list(kinds)
    assert described["num_layers"] == adapter.num_layers >= indices[-1] + 1


def _instance(image_files, n: int) -> Instance:
    return Instance("a photo of a red square", tuple(image_files[:n]), 0, f"w{n}")


@pytest.mark.parametrize(
    ("family", "n", "window"),
    [
        ("gemma3", 3, "sliding_window"),
        ("gemma3", 8, "sliding_window"),
        ("llama4", 8, None),
        ("gemma4", 3, "sliding_window"),
    ],
)
def test_windows_shorter_than_the_prompt_cut_through_the_images(
    family, n, window, image_files, make_instances
):
    """A window / chunk that sees some images and not others: the windowed rows are zero on
    the images out of reach, positive on those in reach, and equal eager attention (the
    model's own mask, by transformers' eager path) to 1e-5, padding included."""
    adapter = get_adapter(*tiny_pair(family))
    config = adapter.model.config.get_text_config()
    size = getattr(config, window) if window else config.attention_chunk_size
    instances = [_instance(image_files, n), *make_instances(1, n, offset=5)]
    batch = adapter.prepare_batch(instances)
    length = batch.inputs["input_ids"].shape[1]
    assert size < length, "the window must be shorter than the prompt"
    _, attention = adapter.run_batch(batch)
    reference = eager_masses(family, batch)
    assert torch.max(torch.abs(attention.double() - reference)) < 1e-5
    windowed = [row for row, kind in enumerate(adapter.attention_layers.kinds) if kind != G]
    first = attention[:, windowed]
    # the shorter-caption row: its window reaches the last image(s) but not the first
    padding = int((batch.inputs["attention_mask"][0] == 0).sum())
    real = length - padding
    if family == "llama4":
        assert size == TINY_CHUNK_SIZE
        chunk_start = padding + ((real - 1) // size) * size  # chunks count from the first token
        assert batch.spans[0][0].end <= chunk_start < batch.spans[0][-1].end
    assert (first[0, :, 0] == 0).all()
    assert (first[0, :, -1] > 0).all()
    globals_ = [row for row, kind in enumerate(adapter.attention_layers.kinds) if kind == G]
    assert (attention[:, globals_] > 0).all(), "global layers see every image"


def test_gemma3_image_blocks_are_bidirectional_in_the_probed_pass(make_instances):
    """The processor's token_type_ids reach the mask: without them (plain causal masks) the
    masses differ, and with them they equal eager attention (the test above)."""
    adapter = get_adapter(*tiny_pair("gemma3"))
    batch = adapter.prepare_batch(make_instances(1, 3))
    assert "token_type_ids" in batch.inputs
    assert int(batch.inputs["token_type_ids"].sum()) == 3 * 4  # 4 soft tokens per image
    _, with_blocks = adapter.run_batch(batch)
    del batch.inputs["token_type_ids"]
    _, causal = adapter.run_batch(batch)
    assert torch.max(torch.abs(with_blocks - causal)) > 1e-4


def test_gemma4_kv_shared_layers_are_read_with_their_own_queries(make_instances):
    """Gemma 4's last two layers reuse the keys and values of layers 3 (sliding) and 2
    (global). In the adapter's prompt pass they compute the last token's query only; the probe
    reads that row, which equals eager attention (all queries), and it is the shared layer's
    own row, not a copy of its source layer's."""
    adapter = get_adapter(*tiny_pair("gemma4"))
    config = adapter.model.config.get_text_config()
    assert config.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    batch = adapter.prepare_batch(make_instances(2, 3))
    queries: dict[int, int] = {}
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda module, args, kwargs, out: queries.__setitem__(
                module.layer_idx, kwargs["hidden_states"].shape[1]
            ),
            with_kwargs=True,
        )
        for layer in language_model(adapter.model).layers
    ]
    try:
        _, attention = adapter.run_batch(batch)
    finally:
        for hook in hooks:
            hook.remove()
    length = batch.inputs["input_ids"].shape[1]
    assert queries == {0: length, 1: length, 2: length, 3: length, 4: 1, 5: 1}
    assert torch.max(torch.abs(attention.double() - eager_masses("gemma4", batch))) < 1e-5
    for shared, source in ((4, 3), (5, 2)):
        assert torch.max(torch.abs(attention[:, shared] - attention[:, source])) > 1e-3


def test_linear_attention_layers_never_reach_the_probe(make_instances):
    """Qwen3.5's Gated DeltaNet layers have no attention matrix: the probe reads layers 3 and
    7 only, and asking it for every layer fails loudly instead of inventing rows."""
    adapter = get_adapter(*tiny_pair("qwen3_5"))
    batch = adapter.prepare_batch(make_instances(1, 3))
    length = batch.inputs["input_ids"].shape[1]
    with torch.no_grad(), recording(span_matrix(batch.spans, length)) as recorder:
        adapter.model_forward(**batch.inputs, position_ids=batch.position_ids)
    assert recorder.recorded_layers == [3, 7]
    kinds = language_model(adapter.model).config.layer_types
    assert [i for i, kind in enumerate(kinds) if kind == "full_attention"] == [3, 7]
    with pytest.raises(AdapterError, match=r"recorded layers \[3, 7\], expected \[0, 1, 2"):
        recorder.attention(LayerSet.dense(8))
    assert recorder.attention(adapter.attention_layers).shape == (1, 2, 3)


def test_llama4_forward_is_composed_from_the_models_parts(make_instances):
    """transformers' own Llama4ForConditionalGeneration.forward cannot run (it reads an
    attribute its language model's output lacks); the adapter's composed forward is checked
    against an independent composition: image features written at the <|patch|> positions by
    index, then the text model and the LM head."""
    adapter = get_adapter(*tiny_pair("llama4"))
    model = adapter.model
    batch = adapter.prepare_batch(make_instances(2, 3))
    inputs = dict(batch.inputs)
    with torch.no_grad():
        with pytest.raises(AttributeError, match="image_outputs"):
            model(**inputs, position_ids=batch.position_ids)
        composed = adapter.model_forward(**inputs, position_ids=batch.position_ids).logits
        ids = inputs["input_ids"]
        embeds = model.get_input_embeddings()(ids).clone()
        vision = model.vision_model(inputs["pixel_values"]).last_hidden_state
        features = model.multi_modal_projector(vision.reshape(-1, vision.shape[-1]))
        rows, cols = torch.nonzero(ids == model.config.image_token_id, as_tuple=True)
        embeds[rows, cols] = features
        text = model.language_model.model(
            inputs_embeds=embeds,
            attention_mask=inputs["attention_mask"],
            position_ids=batch.position_ids,
        )
        independent = model.language_model.lm_head(text.last_hidden_state)
    assert torch.max(torch.abs(composed - independent)) < 1e-5


def test_a_state_is_refused_for_another_layer_set(make_instances):
    """A state fitted on Qwen3.5 (rows = layers 3, 7) refuses Gemma 3 observations (rows =
    layers 0-11) and says which layers each has."""
    qwen = get_adapter(*tiny_pair("qwen3_5"))
    gemma = get_adapter(*tiny_pair("gemma3"))
    calibration = qwen.observe_many(make_instances(3, 3), batch_size=3)
    state = get_calibrator("attention_guided").fit(calibration)
    assert (state.layers, state.layer_kinds) == ([3, 7], [G, G])
    assert state.attention_prior_array.shape == (2, 3)
    foreign = gemma.observe(make_instances(1, 3)[0])
    with pytest.raises(CalibrationError, match=r"layers 3, 7 \(global\).*layers 0-11"):
        get_calibrator("attention_guided").predict(foreign, state)
    with pytest.raises(CalibrationError, match="layers 3, 7"):
        state.check_compatible(layers=gemma.attention_layers)
    prediction = get_calibrator("attention_guided").predict(calibration[0], state)
    assert np.isfinite(prediction.scores).all()


@pytest.mark.parametrize("family", HYBRID)
def test_evaluate_runs_every_calibrator_on_a_saved_tiny_model(family, tmp_path):
    """`posdebias evaluate --model DIR` with every registered calibrator, end to end."""
    from posdebias import get_registry
    from posdebias.cli import main

    model = save_tiny_model(family, tmp_path / family)
    bench = build_shapes_benchmark(tmp_path, count=3, n=3)
    calibrators = sorted(get_registry().calibrator_names())
    out = tmp_path / "run"
    args = ["evaluate", "--model", str(model), "--benchmark", str(bench), "--out", str(out)]
    args += ["--calibrators", ",".join(calibrators), "--count", "2", "--orders", "2"]
    assert main([*args, "--calibration-count", "1", "--batch-size", "2"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["calibrators"]) == calibrators
    indices, kinds = EXPECTED_LAYERS[family]
    assert results["adapter"]["layers"] == list(indices)
    assert results["adapter"]["layer_kinds"] == list(kinds)
    for label, entry in results["calibrators"].items():
        assert 0.0 <= entry["metrics"]["accuracy_mean"] <= 100.0, label
