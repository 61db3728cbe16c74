"""Qwen3-VL and Qwen3-VL-MoE: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

The prompt layout and the multimodal RoPE are Qwen2-VL's (interleaved sections instead of
contiguous ones, which the model's ``get_rope_index`` / rotary embedding handle), so the adapter
is :class:`~posdebias.adapters.families.qwen2_vl.Qwen2VLAdapter` with the model's own
``get_rope_index``.
DeepStack adds visual features of intermediate vision layers to the hidden states of the first
language layers at the image-token positions; that happens inside the prompt forward, so the
probe and the cached decoding steps need nothing extra. Patches are 16 px (32 px per merged
token), not Qwen2-VL's 14.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter


class Qwen3VLAdapter(Qwen2VLAdapter):
    """Qwen3-VL / Qwen3-VL-MoE (``Qwen/Qwen3-VL-8B-Instruct``, ``Qwen/Qwen3-VL-30B-A3B-...``)."""

    name = "qwen3_vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    summary = "Qwen3-VL / Qwen3-VL-MoE (interleaved multimodal RoPE, DeepStack, 16 px patches)"


posdebias_register_adapters = register_hook(Qwen3VLAdapter)
