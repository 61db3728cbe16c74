"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_5_omni.Qwen3OmniMoeAdapter` (the Qwen3-Omni-MoE
thinker), built offline in code from its real config, model and processor classes: the Omni
pieces of the Qwen2.5-Omni builder with Qwen3-VL's vision side (16 px patches, DeepStack) and
a mixture-of-experts language model."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.qwen2_5_omni import (
    TINY_AUDIO,
    OmniTokens,
    omni_chat_template,
    omni_text_config,
    omni_tokenizer,
)
from posdebias.testing.tiny.qwen3_vl import QWEN3_VISION

MODEL_TYPES = ("qwen3_omni_moe_thinker",)

#: Qwen3-Omni's markers (Qwen3-VL's vision tokens).
TOKENS = OmniTokens(
    image_token="<|image_pad|>",
    video_token="<|video_pad|>",
    audio_token="<|audio_pad|>",
    vision_bos_token="<|vision_start|>",
    vision_eos_token="<|vision_end|>",
    audio_bos_token="<|audio_start|>",
    audio_eos_token="<|audio_end|>",
)


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import (
        AutoModelForImageTextToText,
        Qwen3OmniMoeThinkerConfig,
        WhisperFeatureExtractor,
    )
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_omni_moe import Qwen3OmniMoeProcessor
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    chat_template = omni_chat_template(TOKENS, default_system=False)  # the Instruct template's
    tokenizer = omni_tokenizer(TOKENS, chat_template)
    # 16 px patches merged 2 x 2: sizes between 32^2 and 96^2 pixels keep each image's aspect
    # ratio (different images, different token counts).
    pixels = {"shortest_edge": 32 * 32, "longest_edge": 96 * 96}
    processor = Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(
            size=pixels, patch_size=16, merge_size=2, temporal_patch_size=2
        ),
        video_processor=Qwen3VLVideoProcessor(size=pixels, patch_size=16),
        feature_extractor=WhisperFeatureExtractor(feature_size=TINY_AUDIO["num_mel_bins"]),
        tokenizer=tokenizer,
        chat_template=chat_template,
    )
    text = omni_text_config(
        tokenizer,
        rope={"mrope_interleaved": True},
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text,
        vision_config=QWEN3_VISION,
        audio_config={**TINY_AUDIO, "downsample_hidden_size": 8},
        **TOKENS.config_ids(tokenizer),
    )
    return AutoModelForImageTextToText.from_config(config), processor
