"""Ovis2: each image a block from ``<IMG_START>`` to ``<IMG_END>``, its features on visual atoms.

The chat template writes ``<image>`` per image; that text is only a placeholder (no token of the
checkpoints' vocabulary): the processor replaces it with

    <IMG_START> <IMG_ATOM> x L <IMG_GRID> [tiles: <IMG_ATOM> x L each, <IMG_COL> / <IMG_ROW>
    between] <IMG_END>

(the global view, then the tiles of a large image). The model puts the vision features on the
``<IMG_ATOM>`` tokens (``config.image_token_id``) and learned indicator embeddings on the five
markers (``config.visual_indicator_token_ids``), so every token of the block is the image's:
the span is the whole block, one run. The language model is Qwen2 with 1-D RoPE.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, ImageSpan, SpanTokens, find_marked_spans
from posdebias.errors import AdapterError


class Ovis2Adapter(HFAdapter):
    """Ovis2 in the transformers format (``thisisiron/Ovis2-2B-hf`` and relatives)."""

    name = "ovis2"
    model_types = ("ovis2",)
    summary = "Ovis2 (<image> placeholder -> <IMG_START> ... <IMG_END> block of visual atoms)"
    image_token_key = "image_token_id"  # the atoms carry the features; <image> is a placeholder

    def span_tokens(self) -> SpanTokens:
        return SpanTokens(image=int(self.model.config.image_token_id))

    def image_token_ids(self) -> set[int]:
        """The atoms and the five visual indicators: every one lies in some image's block."""
        indicators = [int(token) for token in self.model.config.visual_indicator_token_ids]
        return {self.tokens.image, *indicators}

    def _indicator(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id not in self.image_token_ids():
            raise AdapterError(
                f"{token} is not one of the config's visual_indicator_token_ids "
                f"{list(self.model.config.visual_indicator_token_ids)}: the tokenizer does not "
                "match the model"
            )
        return int(token_id)

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        return find_marked_spans(
            input_ids,
            self._indicator("<IMG_START>"),
            self._indicator("<IMG_END>"),
            num_images,
            "<IMG_START> ... <IMG_END> per image",
        )


posdebias_register_adapters = register_hook(Ovis2Adapter)
