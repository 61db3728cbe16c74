"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_vl.PaddleOCRVLAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("paddleocr_vl",)

#: The checkpoints' chat template: every image of a user turn first, then its texts; the
#: generation prompt is ``Assistant: ``.
CHAT_TEMPLATE = (
    "{{- cls_token -}}{%- for message in messages -%}{%- if message['role'] == 'user' -%}"
    "{{- 'User: ' -}}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' -%}{{ '<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>' }}"
    "{%- endif -%}{%- endfor -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'text' -%}{{ content['text'] }}{%- endif -%}{%- endfor -%}"
    "{{ '\\n' -}}{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}"
    "{%- for content in message['content'] -%}{%- if content['type'] == 'text' -%}"
    "{{ content['text'] }}{%- endif -%}{%- endfor -%}{{ eos_token -}}"
    "{%- elif message['role'] == 'system' -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'text' -%}{{ content['text'] + '\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    """A tiny random-weight PaddleOCR-VL and its processor (toy vocabulary only: the ERNIE
    vocabulary is not available offline)."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.paddleocr_vl import (
        PaddleOCRVLImageProcessor,
        PaddleOCRVLProcessor,
    )

    tokenizer = build_tokenizer(
        [
            "<unk>",
            "<s>",
            "</s>",
            "<|begin_of_sentence|>",
            "<|end_of_sentence|>",
            "<|IMAGE_START|>",
            "<|IMAGE_END|>",
            "<|IMAGE_PLACEHOLDER|>",
            "<|VIDEO_PLACEHOLDER|>",
        ],
        chat_template=CHAT_TEMPLATE,
        eos_token="</s>",
        pad_token="<unk>",
        bos_token="<s>",
        named_tokens={
            "cls_token": "<|begin_of_sentence|>",
            "image_token": "<|IMAGE_PLACEHOLDER|>",
            "video_token": "<|VIDEO_PLACEHOLDER|>",
        },
    )
    # 14 px patches merged 2 x 2 (28 px per token); images kept between 28^2 and 84^2 pixels.
    image_processor = PaddleOCRVLImageProcessor(
        size={"shortest_edge": 28 * 28, "longest_edge": 84 * 84}
    )
    processor = PaddleOCRVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    ids = tokenizer.convert_tokens_to_ids
    text = lm_config(
        tokenizer,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_vision(image_size=84, spatial_merge_size=2),
        image_token_id=ids("<|IMAGE_PLACEHOLDER|>"),
        video_token_id=ids("<|VIDEO_PLACEHOLDER|>"),
        vision_start_token_id=ids("<|IMAGE_START|>"),
        vision_end_token_id=ids("<|IMAGE_END|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
