"""Which language-model layers have softmax attention, read from a Hugging Face text config.

Transformers names each layer's attention in ``config.layer_types``. The softmax kinds map to
:data:`posdebias.core.layers.LAYER_KINDS`; every other type (``linear_attention``: Qwen3.5's
Gated DeltaNet, a recurrent state with no attention matrix) gives no row, because there is no
attention of the last token on the image tokens to read. A config without ``layer_types`` is a
dense model: every layer global, unless it sets a ``sliding_window`` for all layers
(Mistral-style), which makes every layer sliding.

The probe checks the result against the layers that actually called it (probe.py), so a layer
type this table does not know fails loudly instead of being silently dropped or added.
"""

from __future__ import annotations

from typing import Any

from posdebias.core.layers import CHUNKED, GLOBAL, SLIDING, LayerSet
from posdebias.errors import AdapterError

SOFTMAX_LAYER_TYPES: dict[str, str] = {
    "full_attention": GLOBAL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
}
"""transformers ``layer_types`` entry -> posdebias layer kind."""

NO_ATTENTION_LAYER_TYPES: frozenset[str] = frozenset({"linear_attention", "conv"})
"""``layer_types`` entries without softmax attention (no row in the observation): Qwen3.5's
Gated DeltaNet (``linear_attention``) and LFM2's short-convolution blocks (``conv``)."""


def attention_layers(text_config: Any) -> LayerSet:
    """The softmax-attention layers of a language model, with their kinds."""
    depth = int(text_config.num_hidden_layers)
    types = getattr(text_config, "layer_types", None)
    if not types:
        window = getattr(text_config, "sliding_window", None)
        uses_window = window is not None and getattr(text_config, "use_sliding_window", True)
        return LayerSet(tuple(range(depth)), ((SLIDING if uses_window else GLOBAL),) * depth)
    if len(types) != depth:
        raise AdapterError(
            f"the text config names {len(types)} layer_types for {depth} layers; cannot tell "
            "which layers have attention"
        )
    unknown = sorted(
        {t for t in types if t not in SOFTMAX_LAYER_TYPES and t not in NO_ATTENTION_LAYER_TYPES}
    )
    if unknown:
        raise AdapterError(
            f"unknown layer type(s) {unknown} in the text config; posdebias reads "
            f"{', '.join(SOFTMAX_LAYER_TYPES)} (softmax) and skips "
            f"{', '.join(sorted(NO_ATTENTION_LAYER_TYPES))}"
        )
    rows = [
        (index, SOFTMAX_LAYER_TYPES[t]) for index, t in enumerate(types) if t in SOFTMAX_LAYER_TYPES
    ]
    if not rows:
        raise AdapterError(
            "the language model has no softmax-attention layer (layer_types: "
            f"{sorted(set(types))}); the attention-based calibrators cannot be used"
        )
    return LayerSet(tuple(i for i, _ in rows), tuple(kind for _, kind in rows))
