"""Model adapters: each turns one model family into observations.

The Hugging Face adapters import torch and transformers only when a model is loaded, so listing
them (``posdebias plugins``) stays fast.
"""

from posdebias.adapters.base import Adapter, AdapterOptions
from posdebias.adapters.gemma3 import Gemma3Adapter
from posdebias.adapters.generic import GenericAdapter
from posdebias.adapters.glm4v import Glm4vAdapter
from posdebias.adapters.hf import HFAdapter, HFAdapterOptions
from posdebias.adapters.idefics3 import Idefics3Adapter
from posdebias.adapters.internvl import InternVLAdapter
from posdebias.adapters.llama4 import Llama4Adapter
from posdebias.adapters.llava import LlavaAdapter
from posdebias.adapters.llava_onevision import LlavaOnevisionAdapter
from posdebias.adapters.mistral3 import Mistral3Adapter
from posdebias.adapters.qwen2_vl import Qwen2VLAdapter
from posdebias.adapters.qwen3_5 import Qwen3_5Adapter
from posdebias.adapters.qwen3_vl import Qwen3VLAdapter
from posdebias.adapters.synthetic import SyntheticAdapter

__all__ = [
    "Adapter",
    "AdapterOptions",
    "Gemma3Adapter",
    "GenericAdapter",
    "Glm4vAdapter",
    "HFAdapter",
    "HFAdapterOptions",
    "Idefics3Adapter",
    "InternVLAdapter",
    "Llama4Adapter",
    "LlavaAdapter",
    "LlavaOnevisionAdapter",
    "Mistral3Adapter",
    "Qwen2VLAdapter",
    "Qwen3VLAdapter",
    "Qwen3_5Adapter",
    "SyntheticAdapter",
]
