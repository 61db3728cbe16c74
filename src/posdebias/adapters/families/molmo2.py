"""Molmo 2: each image is a low-resolution view and a high-resolution view, back to back.

The processor replaces the placeholder ``<|image|>`` by ``<low_res_im_start>`` + rows of
``<im_patch>`` closed by ``<im_col>`` + ``<im_end>``, then ``<im_start>`` + the pooled crops'
rows the same way + ``<im_end>``; the model ADDS the image features to the ``<im_patch>``
embeddings (the config's ``image_patch_id``, not the processor's placeholder). The span is both
views, from the first start marker to the second ``<im_end>``. Every image token (the
processor's ``mm_token_type_ids``) attends to every other one, across images, in the prompt
forward; the last prompt token and the label steps are text, so their rows stay causal and the
cached label steps are the model's own. Positions are 1-D. The prompt starts with the BOS
the processor would prepend (the checkpoints' chat templates do not write it).
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, ImageSpan, SpanTokens, find_marked_spans

_COLUMN = "<im_col>"


class Molmo2Adapter(HFAdapter):
    """Molmo 2 (``allenai/Molmo2-4B``, ``allenai/Molmo2-8B``, ``allenai/Molmo2-O-7B``)."""

    name = "molmo2"
    model_types = ("molmo2",)
    summary = "Molmo 2 (low- and high-resolution views per image; image tokens bidirectional)"
    image_token_key = "image_patch_id"  # the patch token; the processor's is <|image|>

    def span_tokens(self) -> SpanTokens:
        return SpanTokens(image=int(self.model.config.image_patch_id))

    def chat_text(self, messages: list[dict]) -> str:
        # The checkpoints' templates write no BOS and the processor prepends it (its BOS, or
        # its EOS) to the text; written here, the processor's replacement offsets refer to the
        # prompt as rendered, which the candidate tasks' text spans need.
        text = super().chat_text(messages)
        bos = self.tokenizer.bos_token or self.tokenizer.eos_token
        return text if not bos or text.startswith(bos) else bos + text

    def _starts(self) -> set[int]:
        config = self.model.config
        return {int(config.image_start_token_id), int(config.low_res_image_start_token_id)}

    def image_token_ids(self) -> set[int]:
        """Tokens that only ever belong to an image: every one must lie in some span."""
        end = int(self.model.config.image_end_token_id)
        return {self.tokens.image, *self._starts(), end, self.vocabulary_id(_COLUMN)}

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        end = int(self.model.config.image_end_token_id)
        layout = "low-resolution view then high-resolution view, each closed by <im_end>"
        return find_marked_spans(
            input_ids, self._starts(), end, num_images, layout, blocks_per_image=2
        )


posdebias_register_adapters = register_hook(Molmo2Adapter)
