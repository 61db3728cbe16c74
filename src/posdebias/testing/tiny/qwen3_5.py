"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_vl.Qwen3_5Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import tiny_qwen_vision
from posdebias.testing.tiny.qwen2_vl import qwen_vl_tokenizer
from posdebias.testing.tiny.qwen3_vl import CHAT_TEMPLATE as QWEN3_VL_TEMPLATE
from posdebias.testing.tiny.qwen3_vl import qwen3_vl_model

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
REAL_VOCABULARY = MODEL_TYPES


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    """With the real vocabulary: the Qwen3.5 ranks and specials, Qwen3-VL's prompt layout."""
    moe = {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        # Smaller weights than the dense tiny model: with 0.2 the router's top-2 choice sits so
        # close to ties that float32 rounding between a padded batch and a row alone moves the
        # label scores by ~1e-4, the check's tolerance.
        "initializer_range": 0.05,
    }
    # 8 layers in the real pattern (full_attention_interval 4): linear x3, full, linear x3, full.
    # Rotary on a quarter of each 32-dim head (partial_rotary_factor 0.25, as the checkpoints):
    # 8 dims = 4 frequencies split over (temporal, height, width), interleaved.
    return qwen3_vl_model(
        model_type,
        qwen_vl_tokenizer(QWEN3_VL_TEMPLATE, "qwen3.5" if real_vocabulary else None),
        pixels={"shortest_edge": 64 * 64, "longest_edge": 64 * 64},  # 4 tokens an image
        vision=tiny_qwen_vision(patch_size=16, num_position_embeddings=64),
        tie=real_vocabulary,
        num_hidden_layers=8,
        head_dim=32,
        full_attention_interval=4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        **(moe if model_type == "qwen3_5_moe" else {}),
    )
