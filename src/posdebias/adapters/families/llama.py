"""Llama 3 language models (``meta-llama/Llama-3.1-8B-Instruct``): header-token chat format, 1-D
RoPE, every layer global.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class LlamaAdapter(HFTextAdapter):
    """Llama 3 language models."""

    name = "llama"
    model_types = ("llama",)
    summary = "Llama 3 language models (text candidates)"


posdebias_register_adapters = register_hook(LlamaAdapter)
