"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen3_5.Qwen3_5Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import text_config, tiny_qwen_vision
from posdebias.testing.tiny.qwen2_vl import qwen_vl_tokenizer
from posdebias.testing.tiny.qwen3_vl import CHAT_TEMPLATE as QWEN3_VL_TEMPLATE

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
REAL_VOCABULARY = MODEL_TYPES


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    """With the real vocabulary: the Qwen3.5 ranks and specials, Qwen3-VL's prompt layout."""
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
    if model_type == "qwen3_5_moe":
        text.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            # Smaller weights than the dense tiny model: with 0.2 the router's top-2 choice sits
            # so close to ties that float32 rounding between a padded batch and a row alone
            # moves the label scores by ~1e-4, the check's tolerance.
            initializer_range=0.05,
        )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_qwen_vision(patch_size=16, num_position_embeddings=64),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=real_vocabulary,
    )
    return AutoModelForImageTextToText.from_config(config), processor
