"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.cohere2_vision.Cohere2VisionAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import (
    cohere2_text_config,
    command_template,
    command_tokenizer,
    tiny_siglip,
)

MODEL_TYPES = ("cohere2_vision",)

# Command A Vision's turn format; an image renders as the patch token the processor expands,
# and the generation prompt opens the response.
_TEMPLATE = command_template("<|IMG_PATCH|>", "<|START_RESPONSE|>")


def tiny_model(model_type: str) -> tuple[Any, Any]:
    """A tiny random-weight Cohere2 Vision and its processor (toy vocabulary only: the Cohere
    vocabulary is not available offline)."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.cohere2_vision import (
        Cohere2VisionImageProcessor,
        Cohere2VisionProcessor,
    )

    markers = {
        "image_token": "<|IMG_PATCH|>",
        "boi_token": "<|START_OF_IMG|>",
        "eoi_token": "<|END_OF_IMG|>",
        "img_line_break_token": "<|IMG_LINE_BREAK|>",
    }
    tokenizer = command_tokenizer(
        ["<|START_RESPONSE|>", "<|END_RESPONSE|>", *markers.values()],
        chat_template=_TEMPLATE,
        eos_token="<|END_RESPONSE|>",
        named_tokens=markers,
    )
    # The checkpoints: 512 px tiles, 16 px patches, pixel shuffle 2 -> 16 x 16 tokens per tile
    # (the image processor's patch_size is that side, 16), up to 12 tiles + a thumbnail. Here
    # 56 px tiles of 14 px patches -> 2 x 2 tokens per tile, up to 3 tiles + the thumbnail.
    size, patch, downsample = 56, 14, 2
    image_processor = Cohere2VisionImageProcessor(
        size={"height": size, "width": size}, max_patches=3, patch_size=size // patch // downsample
    )
    processor = Cohere2VisionProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=_TEMPLATE
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=cohere2_text_config(tokenizer),
        vision_config=tiny_siglip(size, patch),
        downsample_factor=downsample,
        alignment_intermediate_size=128,
        image_token_id=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        tie_word_embeddings=True,
    )
    return AutoModelForImageTextToText.from_config(config), processor
