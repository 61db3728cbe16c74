"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.glm4v.Glm4vAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import (
    build_tokenizer,
    chat_template,
    lm_config,
    tiny_qwen_vision,
)

MODEL_TYPES = ("glm4v", "glm4v_moe", "glm46v")


# GLM's chat template, reduced to what the prompt uses.
_TEMPLATE = chat_template(
    start="[gMASK]<sop>",
    turn="<|{{ message['role'] }}|>\n",
    end="",
    generation="<|assistant|>\n",
    image="<|begin_of_image|><|image|><|end_of_image|>",
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.glm4v import (
        Glm4vImageProcessor,
        Glm4vProcessor,
        Glm4vVideoProcessor,
    )
    from transformers.models.glm46v import (
        Glm46VImageProcessor,
        Glm46VProcessor,
        Glm46VVideoProcessor,
    )

    tokenizer = build_tokenizer(
        [
            "[gMASK]",
            "<sop>",
            "<|endoftext|>",
            "<|user|>",
            "<|assistant|>",
            "<|begin_of_image|>",
            "<|end_of_image|>",
            "<|image|>",
            "<|begin_of_video|>",
            "<|end_of_video|>",
            "<|video|>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|user|>",
        pad_token="<|endoftext|>",
        named_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
    )
    # 14 px patches merged 2 x 2 (28 px per token), images kept between 28^2 and 84^2 pixels.
    pixels = {"shortest_edge": 28 * 28, "longest_edge": 84 * 84}
    # GLM-4.6V ships its own processor classes of the same layout
    classes = (
        (Glm46VProcessor, Glm46VImageProcessor, Glm46VVideoProcessor)
        if model_type == "glm46v"
        else (Glm4vProcessor, Glm4vImageProcessor, Glm4vVideoProcessor)
    )
    processor = classes[0](
        image_processor=classes[1](size=pixels),
        tokenizer=tokenizer,
        video_processor=classes[2](),
        chat_template=_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text: dict[str, Any] = lm_config(
        tokenizer,
        head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 1.0,
        },
    )
    if model_type == "glm4v_moe":
        text.update(
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
        )
        text["rope_parameters"] = {**text["rope_parameters"], "partial_rotary_factor": 0.5,
                                   "mrope_section": [1, 1, 2]}  # fmt: skip
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_qwen_vision(image_size=28),
        image_token_id=ids("<|image|>"),
        video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"),
        image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
