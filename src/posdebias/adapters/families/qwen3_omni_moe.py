"""Qwen3-Omni-MoE thinker: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

The Qwen2.5-Omni thinker's layout (:class:`~posdebias.adapters.families.qwen2_5_omni.
Qwen2_5OmniAdapter`: positions from the model's own ``get_rope_index``, passed explicitly) with
Qwen3-VL's vision side: interleaved multimodal RoPE sections, DeepStack features added to the
first language layers inside the prompt forward, 16 px patches; a mixture-of-experts language
model whose layers all have softmax attention.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_5_omni import Qwen2_5OmniAdapter


class Qwen3OmniMoeAdapter(Qwen2_5OmniAdapter):
    """Qwen3-Omni-MoE thinker checkpoints (``model_type`` ``qwen3_omni_moe_thinker``)."""

    name = "qwen3_omni_moe"
    model_types = ("qwen3_omni_moe_thinker",)
    summary = "Qwen3-Omni-MoE thinker (interleaved multimodal RoPE, DeepStack, 16 px patches)"


posdebias_register_adapters = register_hook(Qwen3OmniMoeAdapter)
