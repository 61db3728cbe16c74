"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_vl.Qwen3VLAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import tiny_qwen_vision
from posdebias.testing.tiny.qwen2_vl import qwen_vl_model, qwen_vl_tokenizer

MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe")
REAL_VOCABULARY = MODEL_TYPES


#: The user-turn and generation-prompt layout of the Qwen3-VL Instruct checkpoints' chat template
#: (no default system message; tool and multi-turn branches left out).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: The tiny Qwen3-VL vision tower (16 px patches merged 2 x 2, DeepStack features from two of
#: its three blocks); the Qwen3-Omni-MoE thinker has the same tower.
QWEN3_VISION = tiny_qwen_vision(
    depth=3, patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0, 1]
)


def tiny_model(model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    return qwen3_vl_model(
        model_type,
        qwen_vl_tokenizer(CHAT_TEMPLATE, "qwen3" if real_vocabulary else None),
        # a 64 x 64 image is 4 tokens; sizes between 32^2 and 96^2 pixels keep each image's own
        # aspect ratio (different images, different token counts)
        pixels={"shortest_edge": 32 * 32, "longest_edge": 96 * 96},
        vision=QWEN3_VISION,
        tie=real_vocabulary,
        head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        **(moe if model_type == "qwen3_vl_moe" else {}),
    )


def qwen3_vl_model(
    model_type: str,
    tokenizer: Any,
    *,
    pixels: dict[str, int],
    vision: dict[str, Any],
    tie: bool,
    **text: Any,
) -> tuple[Any, Any]:
    """A tiny model of Qwen3-VL's layout (Qwen3.5's too) and its processor: images resized
    within ``pixels`` in 16 px patches merged 2 x 2, a language model of ``text`` sizes without
    a BOS token, its embeddings tied with ``tie`` (a real vocabulary)."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor

    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            size=pixels, patch_size=16, merge_size=2, temporal_patch_size=2
        ),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=pixels, patch_size=16),
        chat_template=tokenizer.chat_template,
    )
    return qwen_vl_model(model_type, processor, vision, tie=tie, **text)
