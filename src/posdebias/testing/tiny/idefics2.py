"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.idefics2.Idefics2Adapter`, built offline in code (toy
vocabulary only: Idefics2's Mistral vocabulary is not available offline). Image splitting is on,
as in the checkpoints' processor: each image is four crops and the whole image."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config, tiny_vision
from posdebias.testing.tiny.idefics3 import CHAT_TEMPLATE

MODEL_TYPES = ("idefics2",)

#: Idefics2's chat template: Idefics3's without its leading ``<|im_start|>``.
_TEMPLATE = CHAT_TEMPLATE.removeprefix("<|im_start|>")

#: ``<image>`` tokens per image crop (the perceiver's latents; 64 in the checkpoints).
TINY_IMAGE_SEQ_LEN = 3


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.idefics2 import Idefics2ImageProcessor, Idefics2Processor

    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "<fake_token_around_image>", "<image>", "<end_of_utterance>"],
        chat_template=_TEMPLATE,
        eos_token="<end_of_utterance>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={
            "image_token": "<image>",
            "image_boundary_token": "<fake_token_around_image>",
        },
    )
    # The checkpoints: shortest edge 378, longest 980, 14 px patches, 64 latents per crop.
    # Here: every crop resized to 28..56 px, 14 px patches, 3 latents per crop.
    image_processor = Idefics2ImageProcessor(
        size={"shortest_edge": 28, "longest_edge": 56}, do_image_splitting=True
    )
    processor = Idefics2Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=TINY_IMAGE_SEQ_LEN,
        chat_template=_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = lm_config(tokenizer, model_type="mistral")
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=tiny_vision(image_size=56),
        perceiver_config={
            "hidden_size": text["hidden_size"],
            "resampler_n_latents": TINY_IMAGE_SEQ_LEN,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 16,
            "num_key_value_heads": 1,
        },
        image_token_id=ids("<image>"),
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor
