"""Reference-protocol adapter options: image resizing and generation-config processors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_reference import tiny_pair
from PIL import Image

from posdebias import get_adapter
from posdebias.core.instance import Instance
from posdebias.testing import tiny_model_and_processor


def _non_square_instances(tmp_path, n: int = 3) -> list[Instance]:
    rng = np.random.default_rng(5)
    files = []
    for index in range(n):
        file = tmp_path / f"wide_{index}.png"
        Image.fromarray(rng.integers(0, 256, size=(40, 90, 3), dtype=np.uint8)).save(file)
        files.append(file)
    return [Instance(stem="a wide picture", images=files, target=1, id="wide")]


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_image_size_equals_resizing_the_files_bicubic_first(family, tmp_path):
    (instance,) = _non_square_instances(tmp_path)
    model, processor = tiny_pair(family)
    resized = get_adapter(model, processor, image_size=336).observe(instance)
    by_hand = Instance(
        stem=instance.stem,
        images=[
            Image.open(path).convert("RGB").resize((336, 336), Image.Resampling.BICUBIC)
            for path in instance.images
        ],
        target=instance.target,
        id=instance.id,
    )
    plain = get_adapter(model, processor)
    expected = plain.observe(by_hand)
    np.testing.assert_allclose(resized.label_logprobs, expected.label_logprobs, atol=1e-6)
    np.testing.assert_allclose(resized.attention, expected.attention, atol=1e-6)
    native = plain.observe(instance)
    assert not np.allclose(native.attention, resized.attention, atol=1e-6)


@pytest.mark.parametrize("penalty", [1.05, 1.5])
def test_generation_config_processors_apply_the_repetition_penalty(penalty, make_instances):
    """Scores after the processors equal the raw last logits with the repetition penalty
    applied by hand to every label token that occurs in the (unpadded) prompt."""
    model, processor = tiny_model_and_processor("qwen2_5_vl", seed=0)
    model.generation_config.repetition_penalty = penalty
    adapter = get_adapter(model, processor, logits_processors="generation_config")
    raw = get_adapter(model, processor)
    instances = make_instances(2, 4)
    batch = raw.prepare_batch(instances)
    assert (batch.inputs["attention_mask"][0] == 0).any(), "row 0 must be left padded"
    with torch.inference_mode():
        logits = model(**batch.inputs, position_ids=batch.position_ids).logits[:, -1, :]
    label_ids = [path[0] for path in batch.plan.paths]
    assert all(len(path) == 1 for path in batch.plan.paths)
    observed = adapter.observe_many(instances, batch_size=2)
    untouched = raw.observe_many(instances, batch_size=2)
    for row, observation in enumerate(observed):
        ids = batch.inputs["input_ids"][row][batch.inputs["attention_mask"][row] == 1]
        values = logits[row, label_ids].double().clone()
        for k, token in enumerate(label_ids):
            if (ids == token).any():
                values[k] = values[k] / penalty if values[k] > 0 else values[k] * penalty
        expected = torch.log_softmax(values, dim=0).numpy()
        np.testing.assert_allclose(observation.label_logprobs, expected, atol=1e-5)
        in_prompt = [bool((ids == token).any()) for token in label_ids]
        assert any(in_prompt), "the default prompt names the range '1 to 4'"
        assert not np.allclose(observation.label_logprobs, untouched[row].label_logprobs)
        np.testing.assert_allclose(observation.attention, untouched[row].attention, atol=1e-7)


def test_generation_config_processors_are_a_no_op_without_processors(make_instances):
    model, processor = tiny_pair("llava")
    assert model.generation_config.repetition_penalty in (None, 1.0)
    instances = make_instances(1, 4)
    with_processors = get_adapter(model, processor, logits_processors="generation_config")
    np.testing.assert_allclose(
        with_processors.observe(instances[0]).label_logprobs,
        get_adapter(model, processor).observe(instances[0]).label_logprobs,
        atol=1e-6,
    )


def test_generated_rows_pass_through_the_generation_config_processors(make_instances):
    """With logits_processors: generation_config, greedy generation equals the model's own
    ``generate`` under the checkpoint's repetition penalty (and differs from the raw one)."""
    from posdebias.adapters import GenerationSettings

    model, processor = tiny_model_and_processor("qwen2_5_vl", seed=0)
    model.generation_config.repetition_penalty = 50.0
    model.generation_config.eos_token_id = None
    adapter = get_adapter(model, processor, logits_processors="generation_config")
    raw = get_adapter(model, processor)
    instance = make_instances(1, 3)[0]
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False)
    (ours,) = adapter.generate_many([instance], settings)
    (plain,) = raw.generate_many([instance], settings)
    batch = raw.prepare_batch([instance])
    with torch.inference_mode():
        expected = model.generate(
            **batch.inputs, max_new_tokens=6, do_sample=False, min_new_tokens=6
        )
    length = batch.inputs["input_ids"].shape[1]
    assert ours.tokens[0] == expected[0, length:].tolist()
    assert ours.tokens[0] != plain.tokens[0]


def test_max_patches_reference_tiles_images_as_the_processor_does_with_28_over_n(tmp_path):
    """max_patches: reference passes 28 // N to a tiling processor (InternVL), exactly what
    calling the processor with that max_patches gives; a processor that does not tile is left
    as it is."""
    model, processor = tiny_model_and_processor("internvl", seed=0)
    processor.image_processor.crop_to_patches = True
    (instance,) = _non_square_instances(tmp_path, n=3)
    plain = get_adapter(model, processor)
    tiled = get_adapter(model, processor, max_patches="reference")
    assert tiled.tile_limit(3) == 28 // 3 and tiled.tile_limit(12) == 2
    texts = [plain.render(instance)]
    images = [[Image.open(path).convert("RGB") for path in instance.images]]
    by_hand = processor(text=texts, images=images, return_tensors="pt", max_patches=9)
    batch = tiled.prepare_batch([instance])
    assert torch.equal(batch.inputs["input_ids"], by_hand["input_ids"])
    default_ids = plain.prepare_batch([instance]).inputs["input_ids"]
    assert default_ids.shape[1] < batch.inputs["input_ids"].shape[1]  # more tiles per image
    observed = tiled.observe(instance)
    assert np.isfinite(observed.label_logprobs).all()
    assert tiled.describe()["max_patches"] == "reference"
    llava_model, llava_processor = tiny_pair("llava")
    untouched = get_adapter(llava_model, llava_processor, max_patches="reference")
    assert untouched.tile_limit(3) is None  # LLaVA's processor does not tile
