"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.mllama.MllamaAdapter`, built offline in code (toy vocabulary
only: Llama 3's vocabulary is not available offline)."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config

MODEL_TYPES = ("mllama",)

# Llama 3.2 Vision's header format; an image renders as <|image|>, which stays one token.
_TEMPLATE = chat_template(
    start="{{ bos_token }}",
    turn="<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n",
    end="<|eot_id|>",
    generation="<|start_header_id|>assistant<|end_header_id|>\n\n",
    image="<|image|>",
)

#: The tiny language model's cross-attention layers (every fifth from layer 3 in the
#: checkpoints): the layers through which it sees the images.
TINY_CROSS_ATTENTION_LAYERS = [1, 3]


def tiny_model(model_type: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.mllama import MllamaImageProcessor, MllamaProcessor

    tokenizer = build_tokenizer(
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|finetune_right_pad_id|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
            "<|image|>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>",
        named_tokens={"image_token": "<|image|>"},
    )
    # The checkpoints: 560 px tiles of 14 px patches (1,601 encoder tokens per tile, the class
    # token included), up to 4 tiles per image. Here 28 px tiles: 2 x 2 patches + the class
    # token = 5 encoder tokens per tile, up to 4 tiles (an image's unused tiles are padding).
    tile, patch = 28, 14
    processor = MllamaProcessor(
        image_processor=MllamaImageProcessor(
            size={"height": tile, "width": tile}, max_image_tiles=4
        ),
        tokenizer=tokenizer,
        chat_template=_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = {
        **lm_config(tokenizer, num_hidden_layers=4),
        "cross_attention_layers": TINY_CROSS_ATTENTION_LAYERS,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_global_layers": 1,
        "attention_heads": 2,
        "image_size": tile,
        "patch_size": patch,
        "max_num_tiles": 4,
        "intermediate_layers_indices": [0, 1],
        "vision_output_dim": 32 * 3,
    }
    config = AutoConfig.for_model(
        model_type, text_config=text, vision_config=vision, image_token_index=ids("<|image|>")
    )
    model = AutoModelForImageTextToText.from_config(config)
    with torch.no_grad():  # the tanh gates start at zero: no image would reach the text
        for layer in model.model.language_model.layers:
            if hasattr(layer, "cross_attn_attn_gate"):
                layer.cross_attn_attn_gate.fill_(1.0)
                layer.cross_attn_mlp_gate.fill_(1.0)
    return model, processor
