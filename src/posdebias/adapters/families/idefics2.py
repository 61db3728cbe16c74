"""Idefics2: a fixed number of ``<image>`` tokens per image, counted from the processor's own rule.

The processor replaces each ``<image>`` placeholder by

    <fake_token_around_image> <image> x L <fake_token_around_image>

(L = ``image_seq_len``, the perceiver's latents: 64 in the checkpoints), five times over with
image splitting on (four crops and the whole image), and then merges every two touching
``<fake_token_around_image>`` markers into one: between the crops of one image and between two
images that touch in the prompt. It reports no replacement offsets. What identifies the images
exactly is the count: every image has ``L x 5`` (``L`` without splitting) ``<image>`` tokens, no
matter its size, and the ``<image>`` tokens of the prompt come image after image. So image k is
the k-th group of that many ``<image>`` tokens, and its span runs from its first to its last
``<image>`` token, the markers between its crops included; a marker at the edge of an image is
shared with the next image when the two touch, so the edge markers belong to no image. No
substring is re-tokenised.

The text of candidate tasks needs the replacement offsets (where each text lands in the expanded
prompt): :meth:`Idefics2Adapter.processor_inputs` writes them by the same rule (the block of each
image, its first marker left out where it merges with the previous image's last, and the space
the processor puts after a closing marker that touches a word); the tokens of the prompt so
expanded must be the processor's own, which the text spans check. The language model is Mistral
with 1-D RoPE, so positions count from each row's first real token (the default).
"""

from __future__ import annotations

import re
from typing import Any

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, ImageSpan, SpanTokens
from posdebias.errors import AdapterError

CROPS_WHEN_SPLIT = 5
"""Images per placeholder with image splitting on: four crops and the whole image."""


class Idefics2Adapter(HFAdapter):
    """Idefics2 (``HuggingFaceM4/idefics2-8b`` and relatives)."""

    name = "idefics2"
    model_types = ("idefics2",)
    summary = "Idefics2 (image k = its group of image_seq_len x crops <image> tokens)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens(image=int(self.model.config.image_token_id))

    def tokens_per_image(self) -> int:
        """``<image>`` tokens the processor writes for one image (every image the same)."""
        splitting = bool(getattr(self.processor.image_processor, "do_image_splitting", False))
        return int(self.processor.image_seq_len) * (CROPS_WHEN_SPLIT if splitting else 1)

    def processor_inputs(self, texts: list[str], images: list[list[Any]]) -> Any:
        """The processor's inputs, with the replacement offsets it does not report."""
        inputs = super().processor_inputs(texts, images)
        if inputs.get("text_replacement_offsets") is None:
            inputs["text_replacement_offsets"] = [self.replacements(text) for text in texts]
        return inputs

    def replacements(self, text: str) -> list[dict[str, Any]]:
        """Each ``<image>`` placeholder of ``text`` and the text the processor puts there."""
        image, fake = self.processor.image_token, self.processor.fake_image_token
        crops = self.tokens_per_image() // int(self.processor.image_seq_len)
        block = f"{fake}{image * int(self.processor.image_seq_len)}" * crops + fake
        entries: list[dict[str, Any]] = []
        previous_end = -1
        for match in re.finditer(re.escape(image), text):
            start, end = match.span()
            replacement = block[len(fake) :] if start == previous_end else block
            following = text[end : end + 1]
            if following and not following.isspace() and following != "<":
                replacement += " "  # the processor's space after a marker touching a word
            entries.append(
                {"type": "image", "span": (start, end), "text": image, "replacement": replacement}
            )
            previous_end = end
        return entries

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """Image k: from the first to the last of its ``<image>`` tokens (its crops' markers
        between them included)."""
        image = self.tokens.image
        fake = self.tokenizer.convert_tokens_to_ids(self.processor.fake_image_token)
        positions = [t for t, token in enumerate(input_ids) if token == image]
        per_image = self.tokens_per_image()
        if len(positions) != per_image * num_images:
            raise AdapterError(
                f"found {len(positions)} <image> tokens for {num_images} images of {per_image} "
                "tokens each (image_seq_len x crops): the chat template must render one <image> "
                "per image, and the processor's image_seq_len must be the model's perceiver "
                "latents"
            )
        spans = []
        for k in range(num_images):
            first, last = positions[k * per_image], positions[(k + 1) * per_image - 1]
            if any(input_ids[t] not in (image, fake) for t in range(first, last + 1)):
                raise AdapterError(
                    f"image {k + 1}'s <image> tokens have text between them: the processor did "
                    "not expand the placeholder the Idefics2 way"
                )
            spans.append(ImageSpan.of(first, last + 1))
        return spans


posdebias_register_adapters = register_hook(Idefics2Adapter)
