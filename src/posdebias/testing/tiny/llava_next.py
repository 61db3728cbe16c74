"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llava_next.LlavaNextAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import LLAVA_TEMPLATE, build_tokenizer, text_config, tiny_vision

MODEL_TYPES = ("llava_next", "llava_next_video")

# Any-resolution grids of the tiny model: 2 x 2 patches of 14 px per 28 px tile, so a wide image
# gets a 28 x 56 grid (two tiles + the base view) and a square one a 28 x 28 grid.
_PINPOINTS = [[28, 28], [28, 56], [56, 28]]


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.llava_next import LlavaNextImageProcessor, LlavaNextProcessor

    video = model_type == "llava_next_video"
    specials = ["<s>", "</s>", "<pad>", "<image>", *(["<video>"] if video else [])]
    named = {"image_token": "<image>", **({"video_token": "<video>"} if video else {})}
    tokenizer = build_tokenizer(
        specials,
        chat_template=LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens=named,
    )
    size = 28
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_grid_pinpoints=_PINPOINTS,
    )
    common = {
        "image_processor": image_processor,
        "tokenizer": tokenizer,
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "chat_template": tokenizer.chat_template,
    }
    if video:
        from transformers.models.llava_next_video import (
            LlavaNextVideoProcessor,
            LlavaNextVideoVideoProcessor,
        )

        processor: Any = LlavaNextVideoProcessor(
            video_processor=LlavaNextVideoVideoProcessor(
                size={"shortest_edge": size}, crop_size={"height": size, "width": size}
            ),
            **common,
        )
    else:
        processor = LlavaNextProcessor(**common)
    ids = tokenizer.convert_tokens_to_ids
    extra = {"video_token_index": ids("<video>")} if video else {}
    config = AutoConfig.for_model(
        model_type,
        text_config={
            "model_type": "llama",
            **text_config(len(tokenizer), eos_token_id=ids("</s>"), bos_token_id=ids("<s>")),
            "pad_token_id": ids("<pad>"),
        },
        vision_config={
            "model_type": "clip_vision_model",
            **tiny_vision(image_size=size, projection_dim=32),
        },
        image_token_index=ids("<image>"),
        image_grid_pinpoints=_PINPOINTS,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        **extra,
    )
    return AutoModelForImageTextToText.from_config(config), processor
