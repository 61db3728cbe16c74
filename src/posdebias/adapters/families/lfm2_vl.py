"""LFM2-VL: short-convolution blocks beside attention, images between start / end markers.

LFM2's language model interleaves short-convolution blocks (``conv`` in ``layer_types``: a
causal convolution over a few tokens, no attention matrix) with softmax-attention layers; the
observations read the attention layers only, as for Qwen3.5's linear-attention layers. Each image
is ``<|image_start|>``, then its tiles (``<|img_row_R_col_C|>`` + the tile's ``<image>`` tokens)
and the ``<|img_thumbnail|>`` overview, then ``<|image_end|>``: the span is that whole block,
markers and tile labels included, because the processor wrote all of it for this image.
Positions are 1-D (RoPE over token indices).
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, SpanTokens


class Lfm2VlAdapter(HFAdapter):
    """LFM2-VL (``LiquidAI/LFM2-VL-1.6B`` and relatives)."""

    name = "lfm2_vl"
    model_types = ("lfm2_vl",)
    summary = "LFM2-VL (convolution + attention layers; image blocks between start/end)"
    marked_layout = "<|image_start|> tiles and thumbnail <|image_end|>"

    def span_tokens(self) -> SpanTokens:
        start, end = self.vocabulary_id("<|image_start|>"), self.vocabulary_id("<|image_end|>")
        return SpanTokens(image=super().span_tokens().image, start=start, end=end)

    def image_token_ids(self) -> set[int]:
        """Tokens that only ever belong to an image: every one must lie in some span."""
        return {*super().image_token_ids(), self.vocabulary_id("<|img_thumbnail|>")}


posdebias_register_adapters = register_hook(Lfm2VlAdapter)
