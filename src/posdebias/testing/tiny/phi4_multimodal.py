"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.phi4_multimodal.Phi4MultimodalAdapter`, built offline in
code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config, tiny_vision

MODEL_TYPES = ("phi4_multimodal",)

#: The checkpoints' turn format: ``<|user|>`` ... ``<|end|>``, one ``<|image|>`` per image,
#: the generation prompt ``<|assistant|>``.
CHAT_TEMPLATE = chat_template(
    turn="{{ '<|' + message['role'] + '|>' }}",
    end="<|end|>",
    generation="<|assistant|>",
    image="<|image|>",
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    """A tiny random-weight Phi-4-multimodal (a causal LM with its vision and audio encoders)
    and its processor (toy vocabulary only: Phi-4's is not available offline).

    The image processor counts 256 + 16 tokens for the global view of every image and 16 x 16
    per 448 px crop: the vision tower keeps the checkpoints' geometry (448 px crops of 14 px
    patches) and only its widths and depth are small, so an image is about 550 tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.phi4_multimodal import (
        Phi4MultimodalFeatureExtractor,
        Phi4MultimodalImageProcessor,
        Phi4MultimodalProcessor,
    )

    tokenizer = build_tokenizer(
        [
            "<|endoftext|>",
            "<|user|>",
            "<|assistant|>",
            "<|system|>",
            "<|end|>",
            "<|image|>",
            "<|audio|>",
        ],
        chat_template=CHAT_TEMPLATE,
        eos_token="<|end|>",
        pad_token="<|endoftext|>",
        named_tokens={"image_token": "<|image|>", "audio_token": "<|audio|>"},
    )
    processor = Phi4MultimodalProcessor(
        image_processor=Phi4MultimodalImageProcessor(dynamic_hd=4),  # at most 4 crops
        audio_processor=Phi4MultimodalFeatureExtractor(),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        model_type,
        **lm_config(tokenizer, bos_token_id=ids("<|endoftext|>")),
        vision_config=tiny_vision(image_token_id=ids("<|image|>")),
        audio_config={
            "num_blocks": 2,
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 48,
            "depthwise_separable_out_channel": 32,
            "nemo_conv_channels": 32,
            "audio_token_id": ids("<|audio|>"),
        },
    )
    return AutoModelForCausalLM.from_config(config), processor
