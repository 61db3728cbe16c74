"""LLaVA (1.5 and relatives): each image becomes a run of ``<image>`` tokens.

Runs of adjacent images touch, so they are split with the processor's replacement counts. The
processor must know the vision tower's ``patch_size`` (saved in ``processor_config.json`` of the
``llava-hf`` checkpoints) to expand ``<image>`` to the right number of tokens.
"""

from __future__ import annotations

from posdebias.adapters.hf import HFAdapter
from posdebias.errors import AdapterError


class LlavaAdapter(HFAdapter):
    """LLaVA (``llava-hf/llava-1.5-7b-hf`` and relatives)."""

    name = "llava"
    model_types = ("llava",)
    summary = "LLaVA (runs of <image> tokens)"
    split_by_processor_counts = True

    def _image_token(self) -> str:
        if getattr(self.processor, "patch_size", None) is None:
            raise AdapterError(
                "the LLaVA processor has no patch_size, so it cannot expand <image> into the "
                "vision tower's tokens; set processor.patch_size (e.g. 14) and save it"
            )
        return super()._image_token()
