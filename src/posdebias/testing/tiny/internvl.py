"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.internvl.InternVLAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import chatml, chatml_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("internvl",)
REAL_VOCABULARY = MODEL_TYPES


#: The chat template of the transformers-native InternVL3 checkpoints (``-hf``).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\\n' }}{% elif content['type'] == 'video' %}{{ '<video>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.internvl import InternVLProcessor, InternVLVideoProcessor

    tokenizer = chatml_tokenizer(
        ["<img>", "</img>", "<IMG_CONTEXT>", "<video>"],
        chat_template=CHAT_TEMPLATE if real_vocabulary else chatml("<IMG_CONTEXT>\n"),
        named_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
        vocabulary="qwen2.5" if real_vocabulary else None,
    )
    # The real checkpoints: 448 px tiles, patch 14, pixel shuffle 0.5 -> 256 tokens per tile.
    # Here 56 px tiles -> (56 / 14)^2 * 0.25 = 4 tokens per tile, same code path.
    size = 56
    seq_length = (size // 14) ** 2 // 4
    image_processor = GotOcr2ImageProcessor(
        size={"height": size, "width": size}, crop_to_patches=False, max_patches=1
    )
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size={"height": size, "width": size}),
        image_seq_length=seq_length,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        model_type,
        text_config={
            "model_type": "qwen2",
            **lm_config(tokenizer, tie_word_embeddings=real_vocabulary),
        },
        tie_word_embeddings=real_vocabulary,
        vision_config=tiny_vision(image_size=[size, size], patch_size=[14, 14]),
        image_token_id=ids("<IMG_CONTEXT>"),
        image_seq_length=seq_length,
    )
    return AutoModelForImageTextToText.from_config(config), processor
