"""Aya Vision: tiles between ``<|START_OF_IMG|>`` and ``<|END_OF_IMG|>``, a Cohere 2 language model.

The processor's image token (``processor.image_token``, ``<image>``) is only the placeholder
the chat template writes; the processor replaces each one by

    <|START_OF_IMG|> TILE_1 <|IMG_PATCH|> x P ... TILE_t <|IMG_PATCH|> x P
                     TILE_GLOBAL <|IMG_PATCH|> x P <|END_OF_IMG|>

(P tokens per 364 px tile, 169 in the checkpoints; a one-tile image has the global view only),
and the model writes the image features over the ``<|IMG_PATCH|>`` tokens
(``config.image_token_id``). So an image is several runs of patch tokens with tile labels
between them, and its span is the whole block from its start marker to its end marker: every
tile, its label and the global view. The language model is Cohere 2: sliding-window layers with
RoPE and every fourth layer global without positional embedding, all softmax attention over 1-D
token indices, so positions count from each row's first real token (the default).
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, SpanTokens


class AyaVisionAdapter(HFAdapter):
    """Aya Vision (``CohereLabs/aya-vision-8b``, ``CohereLabs/aya-vision-32b``)."""

    name = "aya_vision"
    model_types = ("aya_vision",)
    summary = "Aya Vision (tiles + global view between <|START_OF_IMG|> and <|END_OF_IMG|>)"
    marked_layout = "<|START_OF_IMG|> tiles and global view <|END_OF_IMG|>"
    image_token_key = "image_token_id"  # the patch token; the processor's is a placeholder

    def span_tokens(self) -> SpanTokens:
        processor = self.processor
        return SpanTokens(
            image=int(self.model.config.image_token_id),
            start=self.vocabulary_id(processor.start_of_img_token),
            end=self.vocabulary_id(processor.end_of_img_token),
        )

    def image_token_ids(self) -> set[int]:
        """Patch tokens, tile labels and markers: every one must lie in some span."""
        unknown = {None, self.tokenizer.unk_token_id}
        owned = {t for t in self.processor.image_token_ids if t not in unknown}
        return {self.tokens.image, *owned}


posdebias_register_adapters = register_hook(AyaVisionAdapter)
