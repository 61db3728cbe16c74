"""A real open_clip model from a tiny config (random weights, offline) and the embedding cache."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from posdebias.benchmarks.clip import EmbeddingCache, image_cache_items, load_clip
from posdebias.errors import BenchmarkError


def test_embeddings_are_normalised_and_reproducible(tiny_clip, tiny_clip_config, shapes_root):
    paths = [shapes_root / f"images/{i:06d}.png" for i in range(1, 12)]
    images = tiny_clip.encode_images(paths)
    texts = tiny_clip.encode_texts(["a small red circle at the left on a white background"] * 3)
    assert images.shape == (11, 32) and images.dtype == np.float32
    assert np.allclose(np.linalg.norm(images, axis=1), 1.0, atol=1e-5)
    assert np.allclose(texts[0], texts[2])
    # batch size does not change the result; 'none' weights are seeded, so a reload agrees
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        again = load_clip(str(tiny_clip_config), "none", device="cpu", batch_size=3)
    assert np.allclose(again.encode_images(paths), images, atol=1e-5)
    assert tiny_clip.identity["random_weights"] is True
    assert len(tiny_clip.identity["config_sha256"]) == 64


def test_random_weights_warn_loudly(tiny_clip_config):
    with pytest.warns(UserWarning, match="RANDOM weights"):
        load_clip(str(tiny_clip_config), "none", device="cpu")


def test_bad_model_weights_and_config_are_clear_errors(tmp_path, tiny_clip_config):
    with pytest.raises(BenchmarkError, match=r"unknown CLIP model 'ViT-L-15'.*ViT-L-14"):
        load_clip("ViT-L-15", "openai")
    with pytest.raises(BenchmarkError, match="neither a pretrained tag of ViT-B-32"):
        load_clip("ViT-B-32", "no-such-tag")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"embed_dim": 8}))
    with pytest.raises(BenchmarkError, match="not an open_clip model config"):
        load_clip(str(bad), "none")
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_clip(str(tmp_path / "missing.json"), "none")
    with pytest.raises(BenchmarkError, match="neither a pretrained tag"):
        load_clip(str(tiny_clip_config), "openai")  # a custom config has no tags


def test_cache_hits_misses_and_damaged_files(tmp_path, shapes_root):
    cache = EmbeddingCache(tmp_path / "cache")
    identity = {"model": "m", "pretrained": "p"}
    items = image_cache_items(shapes_root, ["images/000001.png", "images/000002.png"])
    calls = []

    def compute():
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(2, 3)

    first = cache.get_or_compute("images", identity, items, compute)
    second = cache.get_or_compute("images", identity, items, compute)
    assert len(calls) == 1 and np.array_equal(first, second)
    assert cache.misses == ["images"] and cache.hits == ["images"]
    cache.get_or_compute("images", {**identity, "pretrained": "q"}, items, compute)
    cache.get_or_compute("images", identity, items[:1] + items[:1], compute)
    assert len(calls) == 3  # another model or another file list: recomputed
    for path in (tmp_path / "cache").iterdir():
        path.write_bytes(b"not a safetensors file")
    assert np.array_equal(cache.get_or_compute("images", identity, items, compute), first)
    assert len(calls) == 4  # a damaged file is a miss, recomputed and rewritten
    assert np.array_equal(cache.get_or_compute("images", identity, items, compute), first)
    assert len(calls) == 4


def test_local_checkpoint_file_is_loaded(tmp_path, tiny_clip, tiny_clip_config, shapes_root):
    import torch

    # other weights than the seeded random ones, saved as a plain state dict
    state = {k: v + 0.01 * torch.randn_like(v) for k, v in tiny_clip.model.state_dict().items()}
    checkpoint = tmp_path / "tiny.pt"
    torch.save(state, checkpoint)
    loaded = load_clip(str(tiny_clip_config), str(checkpoint), device="cpu")
    assert "random_weights" not in loaded.identity
    assert len(loaded.identity["checkpoint_sha256"]) == 64
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(value, state[name])
    paths = [shapes_root / "images/000001.png"]
    assert not np.allclose(loaded.encode_images(paths), tiny_clip.encode_images(paths))
