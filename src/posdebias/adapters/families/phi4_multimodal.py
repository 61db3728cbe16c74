"""Phi-4-multimodal: a causal language model whose own embedding layer reads images and audio.

transformers' ``phi4_multimodal`` is a causal LM (``AutoModelForCausalLM``): its configuration
is the language model's, with the vision and audio encoders as sub-configs, and its embedding
layer writes the image features over the ``<|image|>`` tokens. The processor expands each
``<|image|>`` of the chat template into the image's tokens (the global view, a separator, the
448 px crops; about 550 for a small image), one run per image; consecutive images' runs touch,
so they are split by the processor's per-image counts. The language model (Phi-4-mini) uses
1-D RoPE. Only the image path is read: audio is never given.

The checkpoints ship their image path as a LoRA of the language model (``vision-lora/``, which
transformers' documentation loads and activates with PEFT). :func:`posdebias.load_adapter`
merges it into the language model when the model folder has it (it needs the ``peft``
package), so the model read is the one that answers about images; ``describe()`` records
``vision_lora``. A model wrapped with :func:`posdebias.get_adapter` is read as given: merge or
activate its vision LoRA first.

transformers installs its output-capture hooks lazily, per sub-model, and installing the
language model's after the vision tower's hooks the tower twice (its selected hidden state is
then the wrong one). The adapter installs the whole model's first when the model has not run;
on a model that ran before it was wrapped, attention maps (``posdebias check``'s eager
reference) are refused instead.
"""

from __future__ import annotations

import weakref
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from posdebias._markers import register_hook
from posdebias._weights import check_safetensors_only
from posdebias.adapters.hf import HFAdapter
from posdebias.errors import AdapterError, InputError

#: The checkpoints' folder of the image path's LoRA.
VISION_LORA = "vision-lora"
#: Models whose vision LoRA :meth:`Phi4MultimodalAdapter.prepare_loaded` merged.
_MERGED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


class Phi4MultimodalAdapter(HFAdapter):
    """Phi-4-multimodal in the transformers format (``microsoft/Phi-4-multimodal-instruct``)."""

    name = "phi4_multimodal"
    model_types = ("phi4_multimodal",)
    summary = "Phi-4-multimodal (image path of a causal LM; its vision LoRA activated)"
    text_config_key = None  # the model's own config is the language model's
    loads_as_causal_lm = True
    split_by_processor_counts = True

    def __init__(self, model: Any, processor: Any, **options: Any) -> None:
        super().__init__(model, processor, **options)
        if not _hooked(_vision_tower(model)):
            from transformers.utils.output_capturing import maybe_install_capturing_hooks

            maybe_install_capturing_hooks(model.model)  # the whole tree, each hook once

    @classmethod
    def prepare_loaded(cls, model: Any, folder: Path) -> Any:
        """Merge the checkpoint's vision LoRA (``vision-lora/``) into the language model, if the
        checkpoint has one: the image path the checkpoints document."""
        lora = folder / VISION_LORA
        if not (lora / "adapter_config.json").is_file():
            return model
        check_safetensors_only(lora)  # never unpickled adapter weights
        if find_spec("peft") is None:
            raise InputError(
                f"{folder} has Phi-4-multimodal's vision LoRA ({VISION_LORA}/), which its "
                "image path needs; merging it needs the peft package (pip install peft)"
            )
        from peft import PeftModel

        merged = PeftModel.from_pretrained(model, str(lora)).merge_and_unload()
        _MERGED[merged] = f"merged from {VISION_LORA}/"
        return merged

    def own_forward(self, **inputs: Any) -> Any:
        """The model's forward; refused when it would ask for attention maps or hidden states of
        a model whose vision tower was hooked on its own (see :func:`_hooked_apart`)."""
        if (inputs.get("output_attentions") or inputs.get("output_hidden_states")) and (
            _hooked_apart(self.model)
        ):
            raise AdapterError(
                "this Phi-4-multimodal ran before posdebias wrapped it, so transformers hooked "
                "its vision tower on its own; asked for attention maps now it would hook the "
                "tower a second time and read the wrong layer's features. Wrap the model before "
                "its first forward, or load it with posdebias.load_adapter"
            )
        return self.model(**inputs)

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Also whether the checkpoint's vision LoRA was merged (None: the model as given)."""
        return {**super().describe(n), "vision_lora": _MERGED.get(self.model)}


def _vision_tower(model: Any) -> Any:
    return model.model.embed_tokens_extend.image_embed.img_processor


def _hooked(module: Any) -> bool:
    return bool(getattr(module, "_output_capturing_hooks_installed", False))


def _hooked_apart(model: Any) -> bool:
    """Whether transformers installed the vision tower's output-capture hooks on their own (its
    first forward does) before the language model's: the language model's installation then
    hooks the tower again, each of its layers' outputs is captured twice and the tower's
    selected hidden state (the features) is the wrong one. Installing the language model's
    first hooks the whole tree once (the adapter does, on a model that has not run yet)."""
    return _hooked(_vision_tower(model)) and not _hooked(model.model)


posdebias_register_adapters = register_hook(Phi4MultimodalAdapter)
