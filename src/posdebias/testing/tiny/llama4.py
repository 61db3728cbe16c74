"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llama4.Llama4Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config, tiny_vision

MODEL_TYPES = ("llama4",)


_TEMPLATE = chat_template(
    start="{{ bos_token }}",
    turn="<|header_start|>{{ message['role'] }}<|header_end|>\n\n",
    end="<|eot|>",
    generation="<|header_start|>assistant<|header_end|>\n\n",
    image="<|image|>",
)


TINY_CHUNK_SIZE = 52


"""The tiny model's attention chunk, shorter than the prompt: at N = 8 with a short caption
(about 100 tokens) the last chunk starts inside the seventh image, at N = 3 (about 70 tokens)
after the last image."""


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.llama4 import Llama4ImageProcessor, Llama4Processor

    tokenizer = build_tokenizer(
        [
            "<|begin_of_text|>",
            "<|eot|>",
            "<|finetune_right_pad|>",
            "<|header_start|>",
            "<|header_end|>",
            "<|image_start|>",
            "<|image_end|>",
            "<|image|>",
            "<|patch|>",
            "<|tile_x_separator|>",
            "<|tile_y_separator|>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|eot|>",
        pad_token="<|finetune_right_pad|>",
        bos_token="<|begin_of_text|>",
    )
    # 56 px tiles of 14 px patches: 4 x 4 patches, pixel shuffle 0.5 -> 4 tokens per tile.
    size = 56
    image_processor = Llama4ImageProcessor(size={"height": size, "width": size}, max_patches=4)
    processor = Llama4Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        pixel_shuffle_ratio=0.5,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    # 8 layers in the checkpoints' pattern: 3 chunked RoPE layers, then 1 global NoPE layer.
    text = {
        "model_type": "llama4_text",
        **lm_config(tokenizer, num_hidden_layers=8, head_dim=16),
        "intermediate_size_mlp": 128,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "no_rope_layer_interval": 4,
        "attention_chunk_size": TINY_CHUNK_SIZE,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    }
    vision = tiny_vision(
        intermediate_size=128,  # 4 x hidden: the pixel shuffle's output width, as the real
        image_size=size,
        pixel_shuffle_ratio=0.5,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        boi_token_index=ids("<|image_start|>"),
        eoi_token_index=ids("<|image_end|>"),
        image_token_index=ids("<|patch|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
