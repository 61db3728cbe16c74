"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.lfm2_vl.Lfm2VlAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chatml, lm_config, tiny_vision

MODEL_TYPES = ("lfm2_vl",)

# LFM2's real layer pattern, shortened: short-convolution blocks with attention between them.
_LAYER_TYPES = ["conv", "full_attention", "conv", "conv", "full_attention", "conv"]


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.lfm2_vl import Lfm2VlImageProcessor, Lfm2VlProcessor

    markers = ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
    tiles = [f"<|img_row_{r}_col_{c}|>" for r in (1, 2) for c in (1, 2)]
    tokenizer = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", *markers, *tiles],
        chat_template=chatml("<image>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        named_tokens={"image_token": "<image>"},
    )
    image_processor = Lfm2VlImageProcessor(
        tile_size=32,
        encoder_patch_size=8,
        downsample_factor=2,
        min_image_tokens=1,
        max_image_tokens=16,
        max_num_patches=64,
        min_tiles=2,
        max_tiles=4,
        do_image_splitting=True,
        size={"height": 32, "width": 32},
    )
    processor = Lfm2VlProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )
    ids = tokenizer.convert_tokens_to_ids
    text = lm_config(tokenizer, num_hidden_layers=len(_LAYER_TYPES), layer_types=_LAYER_TYPES)
    text.pop("intermediate_size")
    config = AutoConfig.for_model(
        model_type,
        text_config={"model_type": "lfm2", **text, "block_ff_dim": 128},
        vision_config={
            "model_type": "siglip2_vision_model",
            **tiny_vision(patch_size=8, num_patches=64),
        },
        image_token_id=ids("<image>"),
        projector_hidden_size=64,
        downsample_factor=2,
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor
