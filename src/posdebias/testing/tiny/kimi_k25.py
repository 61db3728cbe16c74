"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.kimi_k25.KimiK25Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config, tiny_vision

MODEL_TYPES = ("kimi_k25",)

# Kimi K2.5's chat template, reduced to what the prompt uses: each image is
# <|media_begin|>image<|media_content|><|media_pad|><|media_end|>, the processor expands the pad.
_TEMPLATE = chat_template(
    turn="{% if message['role'] == 'user' %}<|im_user|>user<|im_middle|>"
    "{% elif message['role'] == 'assistant' %}<|im_assistant|>assistant<|im_middle|>"
    "{% else %}<|im_system|>system<|im_middle|>{% endif %}",
    end="<|im_end|>",
    generation="<|im_assistant|>assistant<|im_middle|>",
    image="<|media_begin|>image<|media_content|><|media_pad|><|media_end|>",
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.kimi_k25 import (
        Kimi_K25ImageProcessor,
        Kimi_K25Processor,
        Kimi_K25VideoProcessor,
    )

    media = ["<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>"]
    tokenizer = build_tokenizer(
        [
            "[BOS]",
            "[EOS]",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            *media,
            "<|kimi_k25_video_placeholder|>",
            "[PAD]",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="[PAD]",
        bos_token="[BOS]",
    )
    # 14 px patches merged 2 x 2 (28 px per token), images at most 56 px a side: 1 to 4 tokens.
    image_processor = Kimi_K25ImageProcessor(
        size={"max_height": 56, "max_width": 56}, patch_size=14, merge_size=2
    )
    processor = Kimi_K25Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Kimi_K25VideoProcessor(size={"max_height": 56, "max_width": 56}),
        chat_template=_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = lm_config(tokenizer)
    text.update(
        model_type="deepseek_v3",
        # multi-head latent attention and routed experts, as the checkpoints, in miniature
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        num_key_value_heads=4,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    vision = tiny_vision(
        pos_emb_height=4, pos_emb_width=4, pos_emb_time=4, merge_kernel_size=[2, 2]
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        projection_hidden_size=vision["hidden_size"],
        image_token_id=ids("<|media_pad|>"),
        video_token_id=ids("<|kimi_k25_video_placeholder|>"),
        vision_start_token_id=ids("<|media_begin|>"),
        vision_end_token_id=ids("<|media_end|>"),
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor
