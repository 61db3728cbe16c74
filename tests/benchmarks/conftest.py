"""Fixtures for the benchmark tests: real files on disk and a tiny random-weight open_clip."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from posdebias.benchmarks.shapes import generate_shapes_dataset

# A real open_clip architecture, a few MB, random weights; its SimpleTokenizer ships its BPE
# vocabulary inside open_clip, so nothing is downloaded.
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="session")
def tiny_clip_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "tiny-clip.json"
    path.write_text(json.dumps(TINY_CLIP_CONFIG))
    return path


@pytest.fixture(scope="session")
def tiny_clip(tiny_clip_config):
    from posdebias.benchmarks.clip import load_clip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_clip(str(tiny_clip_config), "none", device="cpu", batch_size=8)


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory) -> Path:
    """60 shapes images (COCO-format folder), shared read-only by the tests."""
    return generate_shapes_dataset(tmp_path_factory.mktemp("shapes") / "root", 60, seed=0)
