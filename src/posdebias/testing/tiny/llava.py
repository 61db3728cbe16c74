"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.llava.LlavaAdapter`, built offline in code; the LLaVA-NeXT
builder shares its tokenizer and config."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import LLAVA_TEMPLATE, build_tokenizer, lm_config, tiny_vision

MODEL_TYPES = ("llava",)

#: The processors' image-token count: 14 px patches and the class token, which the "default"
#: feature strategy drops.
PROCESSOR_OPTIONS: dict[str, Any] = {
    "patch_size": 14,
    "vision_feature_select_strategy": "default",
    "num_additional_image_tokens": 1,
}


def llava_tokenizer(*, video: bool = False) -> Any:
    """The toy tokenizer of the LLaVA layout (``<s>``, ``</s>``, ``<pad>``, ``<image>``, and
    ``<video>`` with ``video``)."""
    named = {"image_token": "<image>", **({"video_token": "<video>"} if video else {})}
    return build_tokenizer(
        ["<s>", "</s>", "<pad>", *named.values()],
        chat_template=LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens=named,
    )


def llava_config(model_type: str, tokenizer: Any, image_size: int, **extra: Any) -> Any:
    """A tiny LLaVA-style config: a Llama language model on a CLIP tower, whose second-to-last
    layer's patch features (class token dropped) become the image tokens."""
    from transformers import AutoConfig

    ids = tokenizer.convert_tokens_to_ids
    return AutoConfig.for_model(
        model_type,
        text_config={
            "model_type": "llama",
            **lm_config(tokenizer),
        },
        vision_config={
            "model_type": "clip_vision_model",
            **tiny_vision(image_size=image_size, projection_dim=32),
        },
        image_token_index=ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        **extra,
    )


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, CLIPImageProcessor
    from transformers.models.llava import LlavaProcessor

    tokenizer = llava_tokenizer()
    size = 28  # 2 x 2 patches of 14 (+ CLS, dropped by the "default" feature strategy)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        **PROCESSOR_OPTIONS,
    )
    config = llava_config(model_type, tokenizer, size)
    return AutoModelForImageTextToText.from_config(config), processor
