"""The tiny random-weight test models of the built-in families, one module per family.

Each module holds ``MODEL_TYPES`` (the ``config.model_type`` values it builds) and
``tiny_model(model_type, *, real_vocabulary=False) -> (model, processor)``. :data:`BUILDERS`
maps every model type to its builder; :func:`posdebias.testing.tiny_model_and_processor` is the
public entry point (a plugin adapter's own ``Adapter.tiny_model`` is asked first).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: ``(model_type, *, real_vocabulary=False) -> (model, processor)``.
Builder = Callable[..., tuple[Any, Any]]

#: The builder modules (``posdebias.testing.tiny.NAME``), in the registry's family order.
_MODULES = (
    "qwen2_vl",
    "qwen3_vl",
    "idefics3",
    "mistral3",
    "glm4v",
    "qwen3_5",
    "gemma3",
    "llama4",
    "llava_onevision",
    "internvl",
    "llava",
    "llava_next",
    "lfm2_vl",
    "molmo2",
    "kimi_k25",
    "aya_vision",
    "idefics2",
    "gemma4",
    "mllama",
    "ovis2",
    "cohere2_vision",
    "paddleocr_vl",
    "paligemma",
    "phi4_multimodal",
    "qwen2_5_omni",
    "qwen3_omni_moe",
    "text",  # the text-only language models
)


def _builders() -> dict[str, Builder]:
    builders: dict[str, Builder] = {}
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        builders.update(dict.fromkeys(module.MODEL_TYPES, module.tiny_model))
    return builders


#: ``config.model_type`` -> the builder of its tiny model.
BUILDERS: dict[str, Builder] = _builders()

__all__ = ["BUILDERS", "Builder"]
