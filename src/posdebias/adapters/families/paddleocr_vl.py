"""PaddleOCR-VL: ``<|IMAGE_START|>`` + run of ``<|IMAGE_PLACEHOLDER|>`` + ``<|IMAGE_END|>``.

Its ERNIE-4.5 language model uses multimodal RoPE: image tokens get (temporal, height, width)
positions and the text after an image continues from the largest of them, the Qwen2-VL scheme,
computed by the model's own ``get_rope_index`` from the processor's ``mm_token_type_ids``. So
the adapter is :class:`~posdebias.adapters.families.qwen2_vl.Qwen2VLAdapter` (positions passed
explicitly, also for the cached label steps) with the config's start / end markers. The
checkpoints' chat template writes every image of a user turn before its texts.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter


class PaddleOCRVLAdapter(Qwen2VLAdapter):
    """PaddleOCR-VL (``PaddlePaddle/PaddleOCR-VL``)."""

    name = "paddleocr_vl"
    model_types = ("paddleocr_vl",)
    summary = "PaddleOCR-VL (3-D positions from get_rope_index, image start/end markers)"


posdebias_register_adapters = register_hook(PaddleOCRVLAdapter)
