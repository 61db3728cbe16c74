"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.gemma3.Gemma3Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config, tiny_siglip

MODEL_TYPES = ("gemma3",)


_TEMPLATE = chat_template(
    start="{{ bos_token }}",
    turn="<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n",
    end="<end_of_turn>\n",
    generation="<start_of_turn>model\n",
    image="<start_of_image>",
)


TINY_SLIDING_WINDOW = 52


"""The tiny model's window: shorter than a 3-image prompt (about 70 tokens), long enough to
reach the last image, so the tests exercise windows that see some images and not others."""


def tiny_model(model_type: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.gemma3 import Gemma3ImageProcessor, Gemma3Processor

    tokenizer = build_tokenizer(
        [
            "<bos>",
            "<eos>",
            "<pad>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<end_of_turn>",
        pad_token="<pad>",
        bos_token="<bos>",
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    # 28 px images, 14 px patches: 2 x 2 patches pooled to mm_tokens_per_image = 4 soft tokens.
    size, tokens = 28, 4
    image_processor = Gemma3ImageProcessor(size={"height": size, "width": size})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=tokens,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    # 12 layers in the checkpoints' 5 local : 1 global pattern: layers 5 and 11 are global.
    text = {
        "model_type": "gemma3_text",
        **lm_config(tokenizer, num_hidden_layers=12, head_dim=16),
        "query_pre_attn_scalar": 16,
        "sliding_window": TINY_SLIDING_WINDOW,
        "sliding_window_pattern": 6,
    }
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_siglip(size, 14),
        mm_tokens_per_image=tokens,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    model = AutoModelForImageTextToText.from_config(config)
    projector = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad():  # initialised to zeros: every image would embed the same
        projector.normal_(0.0, 0.2)
    return model, processor
