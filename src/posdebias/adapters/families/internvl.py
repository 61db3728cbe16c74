"""InternVL (transformers-native ``-hf`` checkpoints such as ``OpenGVLab/InternVL3-8B-hf``).

Each image is ``<img>`` + ``<IMG_CONTEXT>`` x 256 per tile + ``</img>`` (256 = (448 / 14)^2 *
0.5^2 for the real checkpoints: 448 px tiles, patch 14, pixel shuffle 0.5); the span is the
whole block including both markers.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import SpanTokens


class InternVLAdapter(HFAdapter):
    """InternVL 2.5 / 3 in the transformers-native format (``model_type: internvl``)."""

    name = "internvl"
    model_types = ("internvl",)
    summary = "InternVL (HF-native; <img> + <IMG_CONTEXT> x 256 per tile + </img>)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens.named(
            self.processor, "image_token_id", "start_image_token_id", "end_image_token_id"
        )


posdebias_register_adapters = register_hook(InternVLAdapter)
