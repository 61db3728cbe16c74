"""The Qwen2-VL layout: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL, which differs only in data and so shares this module and its
hook.

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


class Qwen3VLAdapter(Qwen2VLAdapter):
    """Qwen3-VL / Qwen3-VL-MoE (``Qwen/Qwen3-VL-8B-Instruct``, ``Qwen/Qwen3-VL-30B-A3B-...``).

    The prompt layout and the multimodal RoPE are Qwen2-VL's (interleaved sections instead of
    contiguous ones, which the model's ``get_rope_index`` / rotary embedding handle), so the
    adapter is Qwen2-VL's with the model's own ``get_rope_index``.
    DeepStack adds visual features of intermediate vision layers to the hidden states of the
    first language layers at the image-token positions; that happens inside the prompt forward,
    so the probe and the cached decoding steps need nothing extra. Patches are 16 px (32 px per
    merged token), not Qwen2-VL's 14.
    """

    name = "qwen3_vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    summary = "Qwen3-VL / Qwen3-VL-MoE (interleaved multimodal RoPE, DeepStack, 16 px patches)"


# registration order is the order the registry lists them in
posdebias_register_adapters = register_hook(Qwen2VLAdapter, Qwen3VLAdapter)
