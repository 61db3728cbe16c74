"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.ovis2.Ovis2Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("ovis2",)
REAL_VOCABULARY = MODEL_TYPES

#: The checkpoints' chat template (``thisisiron/Ovis2-1B-hf``): a fixed system turn, ChatML
#: turns, ``<image>`` + newline per image.
CHAT_TEMPLATE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<image>\n' }}{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

#: The visual atom, then the five visual indicators in the order of the config's
#: ``visual_indicator_token_ids`` (the checkpoints' ids 151665..151670 after Qwen2.5's specials).
IMAGE_TOKENS = ("<IMG_ATOM>", "<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    """A tiny random-weight Ovis2 and its processor. ``real_vocabulary``: the Qwen2.5 vocabulary
    of the checkpoints, the image tokens on their official ids."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.ovis2 import Ovis2ImageProcessor, Ovis2Processor

    # <image> is no token of the checkpoints' vocabulary: the processor replaces the text
    tokenizer = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_TOKENS],
        chat_template=CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        vocabulary="qwen2.5" if real_vocabulary else None,
    )
    # 56 px tiles of 14 px patches pooled 2 x 2 (hidden_stride): 4 atoms per tile; a wide or tall
    # image adds up to 4 tiles after the global view, separated by <IMG_COL> / <IMG_ROW>.
    image_processor = Ovis2ImageProcessor(
        size={"height": 56, "width": 56}, crop_to_patches=True, max_patches=4
    )
    processor = Ovis2Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=4,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = lm_config(tokenizer)
    config = AutoConfig.for_model(
        model_type,
        text_config={"model_type": "qwen2", **text},
        # the visual vocabulary: 64 rows, the last 5 the indicators
        vision_config=tiny_vision(image_size=56, hidden_stride=2, vocab_size=64),
        image_token_id=ids(IMAGE_TOKENS[0]),
        visual_indicator_token_ids=[ids(token) for token in IMAGE_TOKENS[1:]],
        vocab_size=len(tokenizer),
        hidden_size=text["hidden_size"],
    )
    return AutoModelForImageTextToText.from_config(config), processor
