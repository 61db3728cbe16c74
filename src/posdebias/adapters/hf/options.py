"""The options of every Hugging Face adapter, declared once: the prompt options
(:class:`~posdebias.adapters.hf.prompt.PromptOptions`), the model's own and those that load it.
An adapter keeps them as parsed (``adapter.options``), so code that reads an option reads it
from here, never from a copy."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

import posdebias.defaults as defaults
from posdebias.adapters.hf.prompt import PromptOptions


class HFAdapterOptions(PromptOptions):
    """Options of every Hugging Face adapter (``adapter.options`` in a config file).

    The prompt options are :class:`PromptOptions`'s; ``model`` and the loading options are used
    by :func:`posdebias.load_adapter`; the others also apply to :func:`posdebias.get_adapter` on
    an already loaded model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, description="model id or local path")
    image_size: int | None = Field(
        default=None,
        ge=1,
        le=defaults.MAX_IMAGE_SIZE,
        description="resize every image to this square (bicubic) first",
    )
    max_patches: Annotated[int, Field(ge=1, le=1_024)] | Literal["reference"] | None = Field(
        default=None,
        description="tiles per image at most, for processors that tile images (InternVL): a "
        "number, or 'reference' = 28 // N (the authors' setting); null: the processor's own",
    )
    logits_processors: Literal["none", "generation_config"] = Field(
        default="none",
        description="score labels on raw logits, or after the checkpoint's generation-config "
        "logits processors (greedy decoding; e.g. a repetition penalty)",
    )
    dtype: str = Field(default="auto", description="auto, float32, bfloat16 or float16")
    device: str | None = Field(default=None, description="cpu, cuda, cuda:1 (default: best)")
    device_map: str | dict[str, Any] | None = Field(default=None, description="accelerate map")
    max_memory: dict[int | str, Annotated[int, Field(ge=1, le=2**60)] | str] | None = Field(
        default=None,
        description="accelerate's memory per device for device_map (devices it names only)",
    )
    trust_remote_code: bool = Field(
        default=False, description="run the checkpoint's own Python code (only if you trust it)"
    )
    revision: str | None = Field(default=None, description="hub branch, tag or commit")
    chat_template: str | None = Field(
        default=None,
        description="the chat template to render prompts with, for a model without one (a base "
        "model) or to replace its own: a Jinja template, a file holding one, or 'raw' (the "
        "prompt's text as it is, after the tokenizer's BOS)",
    )


#: The options of :class:`HFAdapterOptions` that load a model (:func:`posdebias.load_adapter`);
#: an adapter made around a loaded model refuses them.
LOADING_OPTIONS = (
    "model",
    "dtype",
    "device",
    "device_map",
    "max_memory",
    "trust_remote_code",
    "revision",
)

#: The options of :class:`HFAdapterOptions` that act on images only (a text-only model's errors
#: do not offer them).
IMAGE_OPTIONS = ("image_size", "max_patches")
