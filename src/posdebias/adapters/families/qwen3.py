"""Qwen3 and Qwen3-MoE language models (``Qwen/Qwen3-8B``, ``Qwen/Qwen3-30B-A3B``): ChatML
prompts, 1-D RoPE; dense and mixture-of-experts layers alike have softmax attention.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class Qwen3Adapter(HFTextAdapter):
    """Qwen3 / Qwen3-MoE language models."""

    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe")
    summary = "Qwen3 / Qwen3-MoE language models (text candidates)"


posdebias_register_adapters = register_hook(Qwen3Adapter)
