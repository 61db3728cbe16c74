"""The fallback for any ``AutoModelForImageTextToText`` no specific adapter claims.

It needs a processor with a chat template and an ``image_token``; each image's span is its
run of image tokens as the processor expanded it (split by the processor's own per-image
counts), widened by the processor's ``start_image_token`` / ``end_image_token`` when it declares
them. Position ids are counted from the attention mask, which is right for 1-D RoPE language
models only. A model that computes its own positions (multimodal RoPE: ``get_rope_index``, a
``mrope_section`` in its rope parameters) is refused before any forward, and anything else the
first-batch verification catches (verify.py) stops the run: the generic adapter never guesses.
When the spans cannot be found it fails with a message that says what it found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import SpanTokens

_POSITION_METHODS = ("get_rope_index", "compute_3d_position_ids", "get_position_ids")


def own_position_scheme(model: Any) -> str | None:
    """How ``model`` computes non-1-D positions itself, or None when it uses token indices."""
    for owner in (model, getattr(model, "model", None)):
        for method in _POSITION_METHODS:
            if owner is not None and callable(getattr(owner, method, None)):
                return f"it computes its own position ids ({type(owner).__name__}.{method})"
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and ({"mrope_section", "mrope_interleaved"} & set(rope)):
        return "its language model uses multimodal RoPE (mrope_section in rope_parameters)"
    return None


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

    def position_problem(self) -> str | None:
        scheme = own_position_scheme(self.model)
        if scheme is None:
            return None
        return f"{scheme}, and the generic adapter only counts 1-D positions"


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(GenericAdapter)
