"""The Qwen2.5-Omni thinker: ``<|vision_bos|>`` + run of ``<|IMAGE|>`` + ``<|vision_eos|>``.

Qwen2.5-Omni and Qwen3-Omni-MoE, which differs only in data and so shares this module and its
hook.

The thinker is the part of Qwen2.5-Omni that reads text, images, audio and video and writes
text (the talker turns that text into speech; posdebias needs only the thinker). Its Qwen2.5
language model uses Qwen2-VL's multimodal RoPE: image tokens get (temporal, height, width)
positions and the text after an image continues from the largest of them. The model computes
them with its own ``get_rope_index`` from the token ids and the image grids (it finds each image
by its start marker; no ``mm_token_type_ids``); the adapter calls it and passes the positions
explicitly, also for the cached decoding steps of multi-token labels. Images only: posdebias
sends no audio.
"""

from __future__ import annotations

from typing import Any

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter
from posdebias.adapters.hf.spans import SpanTokens
from posdebias.errors import AdapterError


class Qwen2_5OmniAdapter(Qwen2VLAdapter):
    """Qwen2.5-Omni thinker checkpoints (``model_type`` ``qwen2_5_omni_thinker``)."""

    name = "qwen2_5_omni"
    model_types = ("qwen2_5_omni_thinker",)
    summary = "Qwen2.5-Omni thinker (multimodal RoPE from get_rope_index, vision bos/eos markers)"

    def span_tokens(self) -> SpanTokens:
        config = self.model.config
        markers = (config.image_token_id, config.vision_start_token_id, config.vision_end_token_id)
        if any(marker is None for marker in markers):
            raise AdapterError(
                f"the config of {self.model_id} lacks image_token_id, vision_start_token_id or "
                "vision_end_token_id; the model's get_rope_index finds images by them (copy "
                "them from the checkpoint's thinker_config)"
            )
        image, start, end = markers
        return SpanTokens(image=int(image), start=int(start), end=int(end))

    def prompt_position_ids(self, inputs: Any) -> Any:
        """[3, B, T] multimodal RoPE positions, as the thinker computes them for generation."""
        positions, _ = self.model.model.get_rope_index(
            inputs["input_ids"],
            image_grid_thw=inputs.get("image_grid_thw"),
            attention_mask=inputs["attention_mask"],
        )
        return positions


class Qwen3OmniMoeAdapter(Qwen2_5OmniAdapter):
    """Qwen3-Omni-MoE thinker checkpoints (``model_type`` ``qwen3_omni_moe_thinker``):
    ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.

    The Qwen2.5-Omni thinker's layout (positions from the model's own ``get_rope_index``, passed
    explicitly) with Qwen3-VL's vision side: interleaved multimodal RoPE sections, DeepStack
    features added to the first language layers inside the prompt forward, 16 px patches; a
    mixture-of-experts language model whose layers all have softmax attention.
    """

    name = "qwen3_omni_moe"
    model_types = ("qwen3_omni_moe_thinker",)
    summary = "Qwen3-Omni-MoE thinker (interleaved multimodal RoPE, DeepStack, 16 px patches)"


# registration order is the order the registry lists them in
posdebias_register_adapters = register_hook(Qwen2_5OmniAdapter, Qwen3OmniMoeAdapter)
