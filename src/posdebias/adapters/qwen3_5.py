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

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.qwen2_vl import Qwen2VLAdapter, qwen_vl_tokenizer
from posdebias.adapters.qwen3_vl import CHAT_TEMPLATE as QWEN3_VL_TEMPLATE
from posdebias.adapters.tiny import text_config


class Qwen3_5Adapter(Qwen2VLAdapter):
    """Qwen3.5 / Qwen3.5-MoE (``Qwen/Qwen3.5-27B``, ``Qwen/Qwen3.5-35B-A3B`` and relatives)."""

    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_moe")
    summary = "Qwen3.5 / Qwen3.5-MoE (hybrid: full-attention layers read, linear layers skipped)"

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (with the real
        vocabulary: the Qwen3.5 ranks and specials, Qwen3-VL's prompt layout)."""
        return _tiny_model(model_type, real_vocabulary)


def _tiny_model(family: str, real_vocabulary: bool = False) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer = qwen_vl_tokenizer(QWEN3_VL_TEMPLATE, "qwen3.5" if real_vocabulary else None)
    # 16 px patches merged 2 x 2: a 64 x 64 image gives 2 x 2 = 4 tokens.
    pixels = {"shortest_edge": 64 * 64, "longest_edge": 64 * 64}
    image_processor = Qwen2VLImageProcessor(
        size=pixels, patch_size=16, merge_size=2, temporal_patch_size=2
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=pixels, patch_size=16),
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    # 8 layers in the real pattern (full_attention_interval 4): linear x3, full, linear x3, full.
    # Rotary on a quarter of each 32-dim head (partial_rotary_factor 0.25, as the checkpoints):
    # 8 dims = 4 frequencies split over (temporal, height, width), interleaved.
    text: dict[str, Any] = text_config(
        len(tokenizer),
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
        bos_token_id=None,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        tie_word_embeddings=real_vocabulary,
    )
    if family == "qwen3_5_moe":
        text.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
    }
    config = AutoConfig.for_model(
        family,
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=real_vocabulary,
    )
    return AutoModelForImageTextToText.from_config(config), processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(Qwen3_5Adapter)
