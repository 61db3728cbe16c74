"""Mistral 3 (Mistral-Small-3.1 / 3.2) and Pixtral-style image rows.

The Pixtral processor replaces each image by its rows of patch tokens, each row closed by a
break token and the last one by the end token:

    [IMG] x w [IMG_BREAK]  [IMG] x w [IMG_BREAK]  ...  [IMG] x w [IMG_END]

so one image is h runs of ``[IMG]`` and the default span finder (one run per image) would see
h runs per image. The span of an image is the whole block, from its first ``[IMG]`` to its
``[IMG_END]``, break tokens included (they are the image's layout, placed by the processor).
The number of rows and columns follows each image's own size and aspect ratio. The language
model is Mistral with 1-D RoPE (the 2-D RoPE is inside the vision tower), so positions count
from each row's first real token.

The same layout comes with the ``llava`` checkpoints of Pixtral-12B (a LLaVA model with a
Pixtral vision tower and processor); :class:`~posdebias.adapters.families.llava.LlavaAdapter` uses
:func:`pixtral_spans` when its processor has break tokens.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import ImageSpan, SpanTokens, find_closed_spans
from posdebias.errors import AdapterError


def pixtral_tokens(adapter: HFAdapter) -> tuple[int, int, int]:
    """(image, break, end) token ids of a Pixtral-style processor."""
    processor = adapter.processor
    ids = []
    for attribute in ("image_token", "image_break_token", "image_end_token"):
        token = getattr(processor, attribute, None)
        token_id = adapter.tokenizer.convert_tokens_to_ids(token) if token else None
        if token_id is None or token_id == adapter.tokenizer.unk_token_id:
            raise AdapterError(
                f"{type(processor).__name__}.{attribute} ({token!r}) is not a token of this "
                "tokenizer; a Pixtral-style processor needs image, break and end tokens"
            )
        ids.append(int(token_id))
    return ids[0], ids[1], ids[2]


def pixtral_spans(adapter: HFAdapter, input_ids: list[int], num_images: int) -> list[ImageSpan]:
    """Each image's block of ``[IMG]`` rows, breaks and its ``[IMG_END]``."""
    image, brk, end = pixtral_tokens(adapter)
    return find_closed_spans(
        input_ids, {image, brk, end}, end, num_images, "rows of [IMG] closed by [IMG_END]"
    )


class Mistral3Adapter(HFAdapter):
    """Mistral 3 (``mistralai/Mistral-Small-3.1-24B-Instruct-2503`` and relatives)."""

    name = "mistral3"
    model_types = ("mistral3",)
    summary = "Mistral 3 (Pixtral rows: [IMG] x w + [IMG_BREAK] per row, [IMG_END] last)"

    def span_tokens(self) -> SpanTokens:
        image, _, end = pixtral_tokens(self)
        return SpanTokens(image=image, end=end)

    def image_token_ids(self) -> set[int]:
        return set(pixtral_tokens(self))

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        return pixtral_spans(self, input_ids, num_images)


posdebias_register_adapters = register_hook(Mistral3Adapter)
