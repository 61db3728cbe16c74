"""Cohere2 Vision (Command A Vision): tiles between ``<|START_OF_IMG|>`` and ``<|END_OF_IMG|>``.

The chat template writes one ``<|IMG_PATCH|>`` per image; the processor expands it into

    <|START_OF_IMG|> (<|IMG_PATCH|> x P <|IMG_LINE_BREAK|>) x tiles <|END_OF_IMG|>

(P tokens per 512 px tile, 256 in the checkpoints; the tiles of a large image, then its
thumbnail), and the model writes the image features over the ``<|IMG_PATCH|>`` tokens. So an
image is one run of patch tokens per tile, with a line break after each: four images make ten
or more runs. The span is the whole block from the start marker to the end marker, line breaks
included (the processor wrote all of it for this image). The language model is Cohere 2:
sliding-window layers with RoPE and every fourth layer global without positional embedding,
all softmax attention over 1-D token indices.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, SpanTokens


class Cohere2VisionAdapter(HFAdapter):
    """Cohere2 Vision (``CohereLabs/command-a-vision-07-2025``)."""

    name = "cohere2_vision"
    model_types = ("cohere2_vision",)
    summary = "Cohere2 Vision (tiles + thumbnail between <|START_OF_IMG|> and <|END_OF_IMG|>)"
    marked_layout = "<|START_OF_IMG|> tiles, line breaks and thumbnail <|END_OF_IMG|>"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens(
            image=int(self.model.config.image_token_id),
            start=self.vocabulary_id(self.processor.boi_token),
            end=self.vocabulary_id(self.processor.eoi_token),
        )

    def image_token_ids(self) -> set[int]:
        """Patch tokens, line breaks and the markers: every one must lie in some span."""
        markers = (self.processor.boi_token, self.processor.eoi_token)
        line_break = self.processor.img_line_break_token
        return {self.tokens.image, *(self.vocabulary_id(t) for t in (*markers, line_break))}


posdebias_register_adapters = register_hook(Cohere2VisionAdapter)
