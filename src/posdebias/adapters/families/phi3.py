"""Phi-3 language models (``microsoft/Phi-3-mini-4k-instruct``, Phi-4-mini): ``<|user|>`` chat
format, fused QKV projections (the attention interface sees q and k after RoPE as for any
family).
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class Phi3Adapter(HFTextAdapter):
    """Phi-3 / Phi-4-mini language models."""

    name = "phi3"
    model_types = ("phi3",)
    summary = "Phi-3 / Phi-4-mini language models (text candidates)"


posdebias_register_adapters = register_hook(Phi3Adapter)
