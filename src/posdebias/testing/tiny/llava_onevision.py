"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llava.LlavaOnevisionAdapter`, built offline
in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import chatml, chatml_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("llava_onevision",)
REAL_VOCABULARY = MODEL_TYPES


#: The chat template of the llava-hf LLaVA-OneVision checkpoints: every image first, then text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\\n' + content['text'] }}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.llava_onevision import (
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = chatml_tokenizer(
        ["<image>", "<video>"],
        chat_template=CHAT_TEMPLATE if real_vocabulary else chatml("<image>"),
        named_tokens={"image_token": "<image>", "video_token": "<video>"},
        vocabulary="qwen2" if real_vocabulary else None,
    )
    size = 28  # 2 x 2 patches of 14 -> 4 tokens + 1 image-newline per image in multi-image mode
    pinpoints = [[size, size], [size, 2 * size], [2 * size, size], [2 * size, 2 * size]]
    image_processor = LlavaOnevisionImageProcessor(
        size={"height": size, "width": size}, image_grid_pinpoints=pinpoints
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": size, "width": size}),
        num_image_tokens=(size // 14) ** 2,
        vision_feature_select_strategy="full",
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
        vision_config={"model_type": "siglip_vision_model", **tiny_vision(image_size=size)},
        image_token_index=ids("<image>"),
        video_token_index=ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=pinpoints,
    )
    return AutoModelForImageTextToText.from_config(config), processor
