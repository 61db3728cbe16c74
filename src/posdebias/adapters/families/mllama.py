"""Mllama (Llama 3.2 Vision): the images reach the text through cross-attention layers only.

The prompt holds one ``<|image|>`` token per image and nothing else of it; the vision encoder's
tokens of every image (up to four tiles each, every tile its patches and a class token) are the
keys and values of a few CROSS-attention layers (``cross_attention_layers``: every fifth layer
from layer 3 in the checkpoints), whose queries are the prompt's tokens. The other layers are
self-attention over the prompt, where an image is only its placeholder token, the same
embedding for every image.

What "attention on image k" means here: in each cross-attention layer, the last prompt token's
cross-attention probability on image k's encoder tokens (its tiles' patches and class tokens),
summed over those tokens and averaged over heads; an image's padding tiles are masked by the
model (probability 0). So an observation of Mllama has one row per cross-attention layer,
named by its model layer index, of kind ``global`` (each sees every image the processor's
cross-attention mask lets the last token see: with the images next to each other in the prompt,
as the default prompt puts them, all of them). The self-attention layers give no row: their
mass on a placeholder token says where the token is, not what the image shows. The probe reads
the cross-attention layers at the same seam as self-attention (transformers routes both through
its attention interface), checked against eager cross-attention.

The encoder's tokens are ordered image by image, tile by tile, patch by patch (the key order
the model builds), so image k owns keys ``[k x tiles x P, (k + 1) x tiles x P)`` (``tiles``: the
processor's padded tile count, P: patches per tile plus the class token). Label steps after the
prompt carry the cross-attention mask row of the last prompt token (as ``generate`` does). SoFA
does not apply (no image's tokens are in the prompt), and the candidate tasks with text
candidates are refused: a text has no tokens among the cross-attention layers' keys.
"""

from __future__ import annotations

from typing import Any

from posdebias._markers import register_hook
from posdebias.adapters.attention import CrossAttentionSpans
from posdebias.adapters.hf import HFAdapter, ImageSpan, PreparedBatch, SpanTokens, span_matrix
from posdebias.core.layers import GLOBAL, LayerSet
from posdebias.errors import AdapterError


class MllamaAdapter(HFAdapter):
    """Llama 3.2 Vision (``meta-llama/Llama-3.2-11B-Vision-Instruct`` and relatives)."""

    name = "mllama"
    model_types = ("mllama",)
    summary = "Llama 3.2 Vision (rows: the cross-attention layers, over each image's tiles)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens(image=int(self.model.config.image_token_id))

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """Each image's ``<|image|>`` placeholder (one token; the image itself is not in the
        prompt)."""
        found = [t for t, token in enumerate(input_ids) if token == self.tokens.image]
        if len(found) != num_images:
            raise AdapterError(
                f"found {len(found)} <|image|> tokens for {num_images} images: the chat template "
                "must render one <|image|> per image"
            )
        return [ImageSpan.of(t, t + 1) for t in found]

    @property
    def cross_attention_layers(self) -> tuple[int, ...]:
        return tuple(sorted(int(i) for i in self._text_config.cross_attention_layers))

    @property
    def attention_layers(self) -> LayerSet:
        """The cross-attention layers: the only ones that see the images."""
        layers = self.cross_attention_layers
        return LayerSet(layers, (GLOBAL,) * len(layers))

    def encoder_tokens_per_image(self, tiles: int) -> int:
        """Encoder tokens of one image: ``tiles`` x (patches per tile + the class token)."""
        vision = self.model.config.vision_config
        return tiles * ((int(vision.image_size) // int(vision.patch_size)) ** 2 + 1)

    def cross_attention_spans(self, batch: PreparedBatch) -> CrossAttentionSpans:
        pixels = batch.inputs["pixel_values"]  # [B, images, tiles, channels, height, width]
        images, tiles = int(pixels.shape[1]), int(pixels.shape[2])
        size = self.encoder_tokens_per_image(tiles)
        rows = [
            [ImageSpan.of(k * size, (k + 1) * size) for k in range(len(spans))]
            for spans in batch.spans
        ]
        return CrossAttentionSpans(
            frozenset(self.cross_attention_layers), span_matrix(rows, images * size)
        )

    def decode_inputs(self, prompt_inputs: Any, steps: int) -> dict[str, Any]:
        """The new tokens' cross-attention mask rows: the last prompt token's, repeated."""
        mask = prompt_inputs.get("cross_attention_mask")
        if mask is None:
            return {}
        return {"cross_attention_mask": mask[:, -1:].expand(-1, steps, *mask.shape[2:])}

    def task_problem(self, task: str) -> str | None:
        if task == "retrieval":
            return None
        return (
            f"{self.model_id or self.name} reads its images through cross-attention layers, "
            f"whose keys are the images' encoder tokens only; a {task} instance has text "
            "candidates or stem images posdebias cannot place there: use retrieval instances "
            "(N images, one caption)"
        )


posdebias_register_adapters = register_hook(MllamaAdapter)
