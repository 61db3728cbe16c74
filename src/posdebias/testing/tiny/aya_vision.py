"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.aya_vision.AyaVisionAdapter`, built offline in code (toy
vocabulary only: Aya Vision's Cohere vocabulary is not available offline)."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import (
    cohere2_text_config,
    command_template,
    command_tokenizer,
    tiny_siglip,
)

MODEL_TYPES = ("aya_vision",)

# Command A / Aya Vision's turn format; an image renders as the processor's placeholder.
_TEMPLATE = command_template("<image>")


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.aya_vision import AyaVisionProcessor
    from transformers.models.got_ocr2 import GotOcr2ImageProcessor

    tokenizer = command_tokenizer(
        [
            "<image>",
            "<|START_OF_IMG|>",
            "<|END_OF_IMG|>",
            "<|IMG_PATCH|>",
            "<|IMG_LINE_BREAK|>",
            "TILE",
            "TILE_GLOBAL",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|END_OF_TURN_TOKEN|>",
    )
    # The checkpoints: 364 px tiles, 14 px patches, pixel shuffle 2 -> 169 tokens per tile, up
    # to 12 tiles + a global view. Here 56 px tiles -> (56 / 28)^2 = 4 tokens per tile, up to 2
    # tiles (a wide or tall image gets 2 tiles + the global view, a square one the view only).
    size, patch, downsample = 56, 14, 2
    image_processor = GotOcr2ImageProcessor(
        size={"height": size, "width": size}, crop_to_patches=True, max_patches=2
    )
    processor = AyaVisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch,
        img_size=size,
        downsample_factor=downsample,
        chat_template=_TEMPLATE,
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=cohere2_text_config(tokenizer),
        vision_config=tiny_siglip(size, patch),
        downsample_factor=downsample,
        image_token_index=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        tie_word_embeddings=True,
    )
    return AutoModelForImageTextToText.from_config(config), processor
