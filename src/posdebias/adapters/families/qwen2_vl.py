"""The Qwen2-VL layout: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

Qwen2-VL, Qwen2.5-VL, and Qwen3-VL, Qwen3.5 and PaddleOCR-VL, which differ from it only in data
and so share this module and its hook.

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


class Qwen3_5Adapter(Qwen2VLAdapter):
    """Qwen3.5 / Qwen3.5-MoE (``Qwen/Qwen3.5-27B``, ``Qwen/Qwen3.5-35B-A3B`` and relatives): a
    hybrid language model, linear attention in 3 of every 4 layers.

    The prompt layout and the multimodal RoPE are Qwen2-VL's (``<|vision_start|>`` + run of
    ``<|image_pad|>`` + ``<|vision_end|>``; positions from the model's own ``get_rope_index`` with
    the processor's ``mm_token_type_ids``), with 16 px patches. What differs is the language model:
    ``layer_types`` makes every fourth layer ``full_attention`` (softmax, read by the probe) and the
    others ``linear_attention`` (Gated DeltaNet: a recurrent state, no attention matrix, so no
    attention row exists for them). Observations therefore have one row per full-attention layer
    (layers 3, 7, 11, ... of the model), all global. The linear layers' recurrent state cannot be
    cropped after a cached decoding step; adapters/cache.py restores it from a copy.
    """

    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_moe")
    summary = "Qwen3.5 / Qwen3.5-MoE (hybrid: full-attention layers read, linear layers skipped)"


class PaddleOCRVLAdapter(Qwen2VLAdapter):
    """PaddleOCR-VL (``PaddlePaddle/PaddleOCR-VL``): ``<|IMAGE_START|>`` + run of
    ``<|IMAGE_PLACEHOLDER|>`` + ``<|IMAGE_END|>``.

    Its ERNIE-4.5 language model uses multimodal RoPE: image tokens get (temporal, height, width)
    positions and the text after an image continues from the largest of them, the Qwen2-VL
    scheme, computed by the model's own ``get_rope_index`` from the processor's
    ``mm_token_type_ids``. So the adapter is Qwen2-VL's (positions passed explicitly, also for
    the cached label steps) with the config's start / end markers. The checkpoints' chat
    template writes every image of a user turn before its texts.
    """

    name = "paddleocr_vl"
    model_types = ("paddleocr_vl",)
    summary = "PaddleOCR-VL (3-D positions from get_rope_index, image start/end markers)"


# registration order is the order the registry lists them in
posdebias_register_adapters = register_hook(
    Qwen2VLAdapter, Qwen3VLAdapter, Qwen3_5Adapter, PaddleOCRVLAdapter
)
