"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.molmo2.Molmo2Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chatml, text_config, tiny_vision

MODEL_TYPES = ("molmo2",)

# Molmo2's own tokens, in the checkpoints' order right after the base vocabulary (so
# <im_start> = vocab_size, <im_end> = vocab_size + 1, <im_patch> = vocab_size + 2, ...).
_IMAGE_TOKENS = (
    "<im_start>",
    "<im_end>",
    "<im_patch>",
    "<im_col>",
    "<low_res_im_start>",
    "<|image|>",
    "<im_low>",
    "<frame_start>",
    "<frame_end>",
    "<|video|>",
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.molmo2 import (
        Molmo2ImageProcessor,
        Molmo2Processor,
        Molmo2VideoProcessor,
    )

    # The checkpoints' template writes no BOS; the processor prepends it (the eos token).
    template = chatml("<|image|>")
    tokenizer = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        chat_template=template,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    base = len(tokenizer)
    tokenizer.add_tokens(list(_IMAGE_TOKENS), special_tokens=True)
    tokenizer.image_token, tokenizer.video_token = "<|image|>", "<|video|>"
    # 56 px crops of 14 px patches (4 x 4), pooled 2 x 2: 2 x 2 tokens per view; one crop.
    image_processor = Molmo2ImageProcessor(
        size={"height": 56, "width": 56}, max_crops=2, overlap_margins=[1, 1]
    )
    processor = Molmo2Processor(
        image_processor=image_processor,
        video_processor=Molmo2VideoProcessor(size={"height": 56, "width": 56}, num_frames=2),
        tokenizer=tokenizer,
        chat_template=template,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(base, head_dim=16, additional_vocab_size=16)
    text.update(
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=ids("<|im_end|>"),
    )
    vision = tiny_vision(num_key_value_heads=2, head_dim=16, image_size=[56, 56])
    adapter = {
        "vision_feature_layer": [-1, -2],  # two ViT layers concatenated, as the checkpoints
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 64,
        "text_hidden_size": text["hidden_size"],
    }
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        adapter_config=adapter,
        image_start_token_id=ids("<im_start>"),
        low_res_image_start_token_id=ids("<low_res_im_start>"),
        image_end_token_id=ids("<im_end>"),
        image_patch_id=ids("<im_patch>"),
        frame_start_token_id=ids("<frame_start>"),
        frame_end_token_id=ids("<frame_end>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
