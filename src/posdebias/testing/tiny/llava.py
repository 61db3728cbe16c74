"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llava.LlavaAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import LLAVA_TEMPLATE, build_tokenizer, text_config, tiny_vision

MODEL_TYPES = ("llava",)


def llava_tokenizer() -> Any:
    """The toy tokenizer of the LLaVA layout (``<s>``, ``</s>``, ``<pad>``, ``<image>``)."""
    return build_tokenizer(
        ["<s>", "</s>", "<pad>", "<image>"],
        chat_template=LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "<image>"},
    )


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText, CLIPImageProcessor
    from transformers.models.llava import LlavaProcessor

    tokenizer = llava_tokenizer()
    size = 28  # 2 x 2 patches of 14 (+ CLS, dropped by the "default" feature strategy)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
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
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    return AutoModelForImageTextToText.from_config(config), processor
