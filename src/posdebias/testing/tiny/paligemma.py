"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.paligemma.PaliGemmaAdapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, tiny_siglip

MODEL_TYPES = ("paligemma",)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    """A tiny random-weight PaliGemma 2 (a Gemma 2 language model: sliding-window and global
    layers) and its processor, without a chat template as the checkpoints (toy vocabulary only:
    Gemma's is not available offline)."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.paligemma import PaliGemmaProcessor
    from transformers.models.siglip import SiglipImageProcessor

    tokenizer = build_tokenizer(
        ["<pad>", "<eos>", "<bos>", "<image>"],
        chat_template="",
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        named_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = None  # the checkpoints' processors have none
    # 28 px images of 14 px patches: 4 image tokens each (the checkpoints: 224 px, 256 tokens)
    size, patch = 28, 14
    image_processor = SiglipImageProcessor(
        size={"height": size, "width": size}, image_seq_length=(size // patch) ** 2
    )
    # the processor adds <loc0000>..<seg127> to the vocabulary, as the checkpoints have them
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    text = {
        "model_type": "gemma2",
        **lm_config(tokenizer, head_dim=16),  # sliding, global, sliding
        "query_pre_attn_scalar": 16,  # scale 1/4: peaked attention at this size
        "attn_logit_softcapping": 4.0,  # small enough to change the tiny model's attention
        "sliding_window": 4096,
    }
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_siglip(size, patch),
        image_token_index=ids("<image>"),
        vocab_size=len(tokenizer),
        projection_dim=text["hidden_size"],
        hidden_size=text["hidden_size"],
    )
    return AutoModelForImageTextToText.from_config(config), processor
