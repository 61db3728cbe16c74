"""OLMo 2 language models (``allenai/OLMo-2-1124-7B-Instruct``): ``<|user|>`` chat format, QK
norm, 1-D RoPE.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class Olmo2Adapter(HFTextAdapter):
    """OLMo 2 language models."""

    name = "olmo2"
    model_types = ("olmo2",)
    summary = "OLMo 2 language models (text candidates)"


posdebias_register_adapters = register_hook(Olmo2Adapter)
