"""Qwen2-VL and Qwen2.5-VL: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

Their language model uses multimodal RoPE: image tokens get (temporal, height, width) positions
and the text after an image continues from the largest of them, so positions are NOT token
indices. The adapter computes them with the model's own ``get_rope_index`` from the processor's
``mm_token_type_ids`` (without those the model silently falls back to 1-D positions) and passes
them explicitly, also for the cached decoding steps of multi-token labels.
"""

from __future__ import annotations

from typing import Any, ClassVar

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import SpanTokens
from posdebias.errors import AdapterError


class Qwen2VLAdapter(HFAdapter):
    """Qwen2-VL / Qwen2.5-VL (``Qwen/Qwen2.5-VL-3B-Instruct`` and relatives)."""

    name = "qwen2_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_5_vl", "qwen2_vl")
    summary = "Qwen2-VL / Qwen2.5-VL (multimodal RoPE, vision start/end markers)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens.named(
            self.model.config, "image_token_id", "vision_start_token_id", "vision_end_token_id"
        )

    def prompt_position_ids(self, inputs: Any) -> Any:
        """[3, B, T] multimodal RoPE positions, as the model computes them for generation."""
        if "mm_token_type_ids" not in inputs:
            raise AdapterError(
                f"{type(self.processor).__name__} returned no mm_token_type_ids; without them "
                "Qwen2-VL silently drops its multimodal positions (upgrade transformers)"
            )
        rope_model = self.model.model
        positions, _ = rope_model.get_rope_index(
            inputs["input_ids"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"),
            attention_mask=inputs["attention_mask"],
        )
        return positions


posdebias_register_adapters = register_hook(Qwen2VLAdapter)
