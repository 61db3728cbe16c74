"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.qwen2_5_omni.Qwen2_5OmniAdapter` (the Qwen2.5-Omni
thinker), built offline in code from its real config, model and processor classes.

The processor is the real ``Qwen2_5OmniProcessor`` (Qwen2-VL image and video processors, a
Whisper feature extractor for audio, the tokenizer); the model has a tiny audio tower too, so
the thinker is whole, though posdebias sends it images only. The pieces the Qwen3-Omni builder
shares (marker tokens, chat template, token ids) are here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from posdebias.testing.tiny.common import chatml_tokenizer, lm_config
from posdebias.testing.tiny.qwen2_vl import QWEN2_5_VISION

MODEL_TYPES = ("qwen2_5_omni_thinker",)


@dataclass(frozen=True)
class OmniTokens:
    """The marker tokens of an Omni thinker; the field names are the tokenizer attributes the
    Omni processors read (``tokenizer.image_token``, ``tokenizer.vision_bos_token``, ...)."""

    image_token: str
    video_token: str
    audio_token: str
    vision_bos_token: str
    vision_eos_token: str
    audio_bos_token: str
    audio_eos_token: str

    def config_ids(self, tokenizer: Any) -> dict[str, int]:
        """The thinker config's token ids (``get_rope_index`` finds images by the start id)."""
        ids = tokenizer.convert_tokens_to_ids
        return {
            "image_token_id": ids(self.image_token),
            "video_token_id": ids(self.video_token),
            "audio_token_id": ids(self.audio_token),
            "vision_start_token_id": ids(self.vision_bos_token),
            "vision_end_token_id": ids(self.vision_eos_token),
            "audio_start_token_id": ids(self.audio_bos_token),
            "audio_end_token_id": ids(self.audio_eos_token),
        }


#: Qwen2.5-Omni's markers.
TOKENS = OmniTokens(
    image_token="<|IMAGE|>",
    video_token="<|VIDEO|>",
    audio_token="<|AUDIO|>",
    vision_bos_token="<|vision_bos|>",
    vision_eos_token="<|vision_eos|>",
    audio_bos_token="<|audio_bos|>",
    audio_eos_token="<|audio_eos|>",
)


def omni_chat_template(tokens: OmniTokens, *, default_system: bool) -> str:
    """The checkpoints' ChatML layout: each image, audio and video item as its markers around
    one placeholder (the processor expands it); ``default_system``: a system turn "You are a
    helpful assistant." when the conversation has none (Qwen2.5-Omni's template)."""
    system = (
        "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
        "You are a helpful assistant.<|im_end|>\n{% endif %}"
        if default_system
        else ""
    )
    image = f"{tokens.vision_bos_token}{tokens.image_token}{tokens.vision_eos_token}"
    audio = f"{tokens.audio_bos_token}{tokens.audio_token}{tokens.audio_eos_token}"
    video = f"{tokens.vision_bos_token}{tokens.video_token}{tokens.vision_eos_token}"
    return (
        "{% for message in messages %}" + system + "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for content in message['content'] %}"
        "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
        + image
        + "{% elif content['type'] == 'audio' or 'audio' in content %}"
        + audio
        + "{% elif content['type'] == 'video' or 'video' in content %}"
        + video
        + "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def omni_tokenizer(tokens: OmniTokens, chat_template: str) -> Any:
    """The toy ChatML tokenizer with the family's markers as named special tokens."""
    named = asdict(tokens)
    return chatml_tokenizer(named.values(), chat_template=chat_template, named_tokens=named)


def omni_text_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """The tiny language model: 3-D RoPE sections of a 16-wide head."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    return lm_config(
        tokenizer,
        head_dim=16,
        rope_parameters={**rope, **extra.pop("rope", {})},
        bos_token_id=None,
        **extra,
    )


#: A one-layer audio tower (16 mel bins) and the Whisper feature extractor that feeds it.
TINY_AUDIO = {
    "num_mel_bins": 16,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "d_model": 16,
    "output_dim": 64,
    "max_source_positions": 100,
}


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import (
        AutoModelForImageTextToText,
        Qwen2_5OmniThinkerConfig,
        WhisperFeatureExtractor,
    )
    from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    chat_template = omni_chat_template(TOKENS, default_system=True)
    tokenizer = omni_tokenizer(TOKENS, chat_template)
    # 56 x 56 pixels -> 4 x 4 patches of 14 -> 2 x 2 merged tokens per image.
    pixels = {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}
    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(size=pixels),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=TINY_AUDIO["num_mel_bins"]),
        tokenizer=tokenizer,
        chat_template=chat_template,
    )
    config = Qwen2_5OmniThinkerConfig(
        text_config=omni_text_config(tokenizer),
        vision_config=QWEN2_5_VISION,
        audio_config={**TINY_AUDIO, "n_window": 10},
        **TOKENS.config_ids(tokenizer),
    )
    return AutoModelForImageTextToText.from_config(config), processor
