"""Kimi K2.5 / K2.6: each image is ``<|media_begin|>image<|media_content|>`` + a run of
``<|media_pad|>`` + ``<|media_end|>``.

The chat template writes the whole block per image and the processor expands the pad into the
image's merged patches (2 x 2 patches of 14 px per token); the span is the block from
``<|media_begin|>`` to ``<|media_end|>``, markers and the ``image`` word included, as the
Qwen2-VL span includes its vision markers. The language model is DeepSeek-V3 (multi-head latent
attention, routed experts) with 1-D RoPE positions, so the shared machinery's positions and
cached label steps are the model's own.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, SpanTokens

_CONTENT = "<|media_content|>"


class KimiK25Adapter(HFAdapter):
    """Kimi K2.5 and K2.6 (``moonshotai/Kimi-K2.5``, ``moonshotai/Kimi-K2.6``)."""

    name = "kimi_k25"
    model_types = ("kimi_k25",)
    summary = "Kimi K2.5 / K2.6 (media blocks <|media_begin|> ... <|media_end|>; DeepSeek-V3)"
    marked_layout = "<|media_begin|>image<|media_content|> pads <|media_end|>"

    def span_tokens(self) -> SpanTokens:
        config = self.model.config
        start, end = int(config.vision_start_token_id), int(config.vision_end_token_id)
        return SpanTokens(image=super().span_tokens().image, start=start, end=end)

    def image_token_ids(self) -> set[int]:
        """Tokens that only ever belong to an image: every one must lie in some span."""
        return {*super().image_token_ids(), self.vocabulary_id(_CONTENT)}


posdebias_register_adapters = register_hook(KimiK25Adapter)
