"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.idefics3.Idefics3Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("idefics3", "smolvlm")


# SmolVLM's chat template: "User:<image>...<end_of_utterance>\nAssistant:".
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText

    tiles = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
    tokenizer = build_tokenizer(
        [
            "<|im_start|>",
            "<|im_end|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<image>",
            "<global-img>",
            "<video>",
            "\n",  # the tiny tokenizer drops whitespace; real ones keep the row separators
            *tiles,
        ],
        chat_template=CHAT_TEMPLATE,
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        named_tokens={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    # The real checkpoints: longest edge resized to 4 x 364 (SmolVLM: 4 x 384), tiles of 364
    # (384), 169 (81) tokens per tile. Here: longest edge 128, 64 px tiles of 16 px patches,
    # pixel shuffle 2 -> (64 / 16)^2 / 2^2 = 4 tokens per tile, up to 2 x 2 tiles per image.
    tile, seq_len = 64, 4
    image_kwargs = {
        "size": {"longest_edge": 2 * tile},
        "max_image_size": {"longest_edge": tile},
        "do_image_splitting": True,
    }
    ids = tokenizer.convert_tokens_to_ids
    vision = tiny_vision(image_size=tile, patch_size=16)
    text = lm_config(tokenizer, model_type="llama", bos_token_id=None)
    if model_type == "idefics3":
        from transformers.models.idefics3 import Idefics3ImageProcessor, Idefics3Processor

        processor = Idefics3Processor(
            image_processor=Idefics3ImageProcessor(**image_kwargs),
            tokenizer=tokenizer,
            image_seq_len=seq_len,
            chat_template=CHAT_TEMPLATE,
        )
    else:
        from transformers.models.smolvlm import (
            SmolVLMImageProcessor,
            SmolVLMProcessor,
            SmolVLMVideoProcessor,
        )

        processor = SmolVLMProcessor(
            image_processor=SmolVLMImageProcessor(**image_kwargs),
            tokenizer=tokenizer,
            video_processor=SmolVLMVideoProcessor(),
            image_seq_len=seq_len,
            chat_template=CHAT_TEMPLATE,
        )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor
