"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.mistral3.Mistral3Adapter`, built offline in code."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, message_content, tiny_vision

MODEL_TYPES = ("mistral3",)


# Mistral's chat template, reduced to what the prompt uses.
_TEMPLATE = (
    "<s>{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    + message_content("[IMG]")
    + "[/INST]{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
)


def tiny_pixtral_parts(size: int = 64) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(tokenizer, processor, text config, vision config) of a tiny Pixtral-style model.

    16 px patches merged 2 x 2 (Mistral 3; 32 px per token), images resized to at most
    ``size`` px on the longest edge: a 64 x 64 image is 2 rows of 2 tokens.
    """
    from transformers.models.pixtral import PixtralImageProcessor, PixtralProcessor

    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
        chat_template=_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "[IMG]"},
    )
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": size}, patch_size={"height": 32, "width": 32}
        ),
        tokenizer=tokenizer,
        patch_size=16,
        spatial_merge_size=2,
        chat_template=_TEMPLATE,
    )
    text = lm_config(tokenizer, model_type="mistral", head_dim=16, sliding_window=None)
    vision = {"model_type": "pixtral", **tiny_vision(head_dim=16, image_size=size, patch_size=16)}
    return tokenizer, processor, text, vision


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText

    tokenizer, processor, text, vision = tiny_pixtral_parts()
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor


def tiny_llava_pixtral() -> tuple[Any, Any]:
    """A tiny Pixtral-12B-style ``llava`` model (Pixtral vision tower and processor), for tests."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    tokenizer, processor, text, vision = tiny_pixtral_parts()
    processor.spatial_merge_size = 1  # Pixtral-12B: no patch merging, 16 px per token
    processor.image_processor.patch_size = {"height": 16, "width": 16}
    processor.image_processor.size = {"longest_edge": 48}
    config = AutoConfig.for_model(
        "llava",
        text_config=text,
        vision_config={**vision, "image_size": 48},
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config)
    model.set_attn_implementation("sdpa")
    return model.eval(), processor
