"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_vl.Qwen2VLAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import chatml, chatml_tokenizer, lm_config, tiny_qwen_vision

MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
REAL_VOCABULARY = MODEL_TYPES


#: The chat template of the Qwen2-VL / Qwen2.5-VL instruct checkpoints (default system message).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: The tiny Qwen2.5-VL vision tower (14 px patches merged 2 x 2, windowed attention, one full
#: block); the Qwen2.5-Omni thinker has the same tower.
QWEN2_5_VISION = tiny_qwen_vision(window_size=56, fullatt_block_indexes=[1])


def qwen_vl_tokenizer(chat_template: str, vocabulary: str | None) -> Any:
    """The tokenizer of the Qwen-VL layout (ChatML, ``<|vision_start|>`` + ``<|image_pad|>`` +
    ``<|vision_end|>``): the toy one with a ChatML template, or with ``vocabulary`` the real one
    with ``chat_template`` (the checkpoints')."""
    return chatml_tokenizer(
        ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
        chat_template=chat_template
        if vocabulary is not None
        else chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        named_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        vocabulary=vocabulary,
    )


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import (
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = qwen_vl_tokenizer(
        CHAT_TEMPLATE,
        (("qwen2.5" if model_type == "qwen2_5_vl" else "qwen2_vl") if real_vocabulary else None),
    )
    # 56 x 56 pixels -> 4 x 4 patches of 14 -> 2 x 2 merged tokens per image.
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 56 * 56, "longest_edge": 56 * 56}
    )
    processor_class = Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    vision: dict[str, Any] = QWEN2_5_VISION
    if model_type == "qwen2_vl":
        vision = {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    return qwen_vl_model(model_type, processor, vision, tie=real_vocabulary, rope_parameters=rope)


def qwen_vl_model(
    model_type: str, processor: Any, vision: dict[str, Any], *, tie: bool, **text: Any
) -> tuple[Any, Any]:
    """A tiny model of the Qwen-VL layout (Qwen2-VL to Qwen3.5) and ``processor``: the vision
    tower ``vision``, a ChatML language model of ``text`` sizes without a BOS token, its
    embeddings tied with ``tie`` (a real vocabulary)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    tokenizer = processor.tokenizer
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        model_type,
        text_config=lm_config(tokenizer, bos_token_id=None, tie_word_embeddings=tie, **text),
        vision_config=vision,
        tie_word_embeddings=tie,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
