"""Put the prompt's KV cache back after a cached decoding step, for every kind of cache layer.

Label scoring (scoring.py) decodes each multi-token prefix on top of the prompt's cache and must
then return to the prompt. A full-attention layer is rewound by cropping its last k positions.
Two layer kinds cannot be cropped back: a sliding-window layer whose window is full has already
dropped the keys the rewind would need, and a linear-attention layer (Qwen3.5's Gated DeltaNet)
holds a recurrent state that its update overwrote in place. Those layers are copied once after
the prompt forward (their size is bounded by the window, or fixed, never the prompt length) and
restored from the copy; transformers' own ``crop`` raises on them.
"""

from __future__ import annotations

import copy
from typing import Any

from posdebias.errors import AdapterError


class PromptCache:
    """The prompt's cache and what is needed to rewind it to the prompt after each step."""

    def __init__(self, cache: Any, length: int) -> None:
        from transformers.cache_utils import DynamicLayer

        self.cache = cache
        self.length = length
        layers = getattr(cache, "layers", None)
        if layers is None:
            raise AdapterError(
                f"{type(cache).__name__} has no per-layer cache; cannot rewind it after a "
                "decoding step"
            )
        self._saved = {
            index: copy.deepcopy(layer)
            for index, layer in enumerate(layers)
            if type(layer) is not DynamicLayer
        }

    def rewind(self, steps: int) -> None:
        """Remove the ``steps`` tokens decoded since the prompt from every layer."""
        layers = self.cache.layers
        for index, layer in enumerate(layers):
            if index in self._saved:
                layers[index] = copy.deepcopy(self._saved[index])
            else:
                layer.crop(-steps)
        if self.cache.get_seq_length() != self.length:
            raise AdapterError("the KV cache could not be rewound to the prompt")
