"""The fallback for any ``AutoModelForImageTextToText`` no specific adapter claims.

It needs a processor with a chat template and an ``image_token``; each image's span is its
run of image tokens as the processor expanded it (split by the processor's own per-image
counts), widened by the processor's ``start_image_token`` / ``end_image_token`` when it declares
them. Position ids are counted from the attention mask, which is right for 1-D RoPE language
models; a family with its own position scheme (like Qwen's multimodal RoPE) needs its own
adapter. When the spans cannot be found it fails with a message that says so.
"""

from __future__ import annotations

from collections.abc import Callable

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.spans import SpanTokens


class GenericAdapter(HFAdapter):
    """Any image-text-to-text model with a chat template and an image token."""

    name = "generic"
    model_types = ()
    summary = "any AutoModelForImageTextToText with a chat template and an image token"
    split_by_processor_counts = True

    def span_tokens(self) -> SpanTokens:
        base = super().span_tokens()
        markers = []
        for attribute in ("start_image_token", "end_image_token"):
            token = getattr(self.processor, attribute, None)
            token_id = self.tokenizer.convert_tokens_to_ids(token) if token else None
            markers.append(None if token_id in (None, self.tokenizer.unk_token_id) else token_id)
        return SpanTokens(image=base.image, start=markers[0], end=markers[1])


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(GenericAdapter)
