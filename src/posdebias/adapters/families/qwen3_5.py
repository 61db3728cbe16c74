"""Qwen3.5 and Qwen3.5-MoE: a hybrid language model, linear attention in 3 of every 4 layers.

The prompt layout and the multimodal RoPE are Qwen2-VL's (``<|vision_start|>`` + run of
``<|image_pad|>`` + ``<|vision_end|>``; positions from the model's own ``get_rope_index`` with
the processor's ``mm_token_type_ids``), with 16 px patches. What differs is the language model:
``layer_types`` makes every fourth layer ``full_attention`` (softmax, read by the probe) and the
others ``linear_attention`` (Gated DeltaNet: a recurrent state, no attention matrix, so no
attention row exists for them). Observations therefore have one row per full-attention layer
(layers 3, 7, 11, ... of the model), all global. The linear layers' recurrent state cannot be
cropped after a cached decoding step; adapters/cache.py restores it from a copy.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter


class Qwen3_5Adapter(Qwen2VLAdapter):
    """Qwen3.5 / Qwen3.5-MoE (``Qwen/Qwen3.5-27B``, ``Qwen/Qwen3.5-35B-A3B`` and relatives)."""

    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_moe")
    summary = "Qwen3.5 / Qwen3.5-MoE (hybrid: full-attention layers read, linear layers skipped)"


posdebias_register_adapters = register_hook(Qwen3_5Adapter)
