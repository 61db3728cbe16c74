"""Mistral language models (``mistralai/Mistral-7B-Instruct-v0.3``): ``[INST]`` chat format; a
config with a ``sliding_window`` makes every layer sliding (layers.py).
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class MistralAdapter(HFTextAdapter):
    """Mistral language models."""

    name = "mistral"
    model_types = ("mistral",)
    summary = "Mistral language models (text candidates)"


posdebias_register_adapters = register_hook(MistralAdapter)
