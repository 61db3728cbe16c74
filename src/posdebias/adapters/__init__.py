"""Model adapters: each turns one model family into observations.

The Hugging Face adapters import torch and transformers only when a model is loaded, so listing
them (``posdebias plugins``) stays fast.
"""

from posdebias.adapters.base import Adapter, AdapterOptions
from posdebias.adapters.gemma3 import Gemma3Adapter
from posdebias.adapters.generic import GenericAdapter
from posdebias.adapters.hf import HFAdapter, HFAdapterOptions
from posdebias.adapters.internvl import InternVLAdapter
from posdebias.adapters.llama4 import Llama4Adapter
from posdebias.adapters.llava import LlavaAdapter
from posdebias.adapters.llava_onevision import LlavaOnevisionAdapter
from posdebias.adapters.qwen2_vl import Qwen2VLAdapter
from posdebias.adapters.qwen3_5 import Qwen3_5Adapter
from posdebias.adapters.synthetic import SyntheticAdapter

__all__ = [
    "Adapter",
    "AdapterOptions",
    "Gemma3Adapter",
    "GenericAdapter",
    "HFAdapter",
    "HFAdapterOptions",
    "InternVLAdapter",
    "Llama4Adapter",
    "LlavaAdapter",
    "LlavaOnevisionAdapter",
    "Qwen2VLAdapter",
    "Qwen3_5Adapter",
    "SyntheticAdapter",
]
