"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llava.LlavaNextAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.llava import PROCESSOR_OPTIONS, llava_config, llava_tokenizer

MODEL_TYPES = ("llava_next", "llava_next_video")

# Any-resolution grids of the tiny model: 2 x 2 patches of 14 px per 28 px tile, so a wide image
# gets a 28 x 56 grid (two tiles + the base view) and a square one a 28 x 28 grid.
_PINPOINTS = [[28, 28], [28, 56], [56, 28]]


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText
    from transformers.models.llava_next import LlavaNextImageProcessor, LlavaNextProcessor

    video = model_type == "llava_next_video"
    tokenizer = llava_tokenizer(video=video)
    size = 28
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_grid_pinpoints=_PINPOINTS,
    )
    common = {
        "image_processor": image_processor,
        "tokenizer": tokenizer,
        "chat_template": tokenizer.chat_template,
        **PROCESSOR_OPTIONS,
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
    config = llava_config(model_type, tokenizer, size, image_grid_pinpoints=_PINPOINTS, **extra)
    return AutoModelForImageTextToText.from_config(config), processor
