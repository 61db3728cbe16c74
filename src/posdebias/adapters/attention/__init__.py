"""Everything registered with transformers' attention interface, composed in ONE function.

:func:`attention_forward` is registered as the attention implementation ``posdebias_probe`` of a
model's language model (:func:`install_probe`; the vision tower keeps its own). Three behaviours
hang on it, each inactive (the call is plain SDPA) unless its context manager is entered, and
they apply in this order:

1. SoFA's mask (:mod:`~posdebias.adapters.attention.sofa`, :func:`sofa_attention`): the mask of
   the chosen layers of a prompt pass opens the blocks from each image to the later ones;
2. shared-prefix decoding (:mod:`~posdebias.adapters.attention.shared_prefix`): samples of one
   prompt attend to ONE copy of its keys and values (this answers the call);
3. the attention probe (:mod:`~posdebias.adapters.attention.probe`, :func:`recording`): the last
   query row's attention mass on each image, recorded beside
4. the stock SDPA function, which computes the layer's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posdebias.adapters.attention.probe import (
    AttentionRecorder,
    CrossAttentionSpans,
    active_recorder,
    recording,
)
from posdebias.adapters.attention.shared_prefix import shared_prefix_attention
from posdebias.adapters.attention.sofa import adjust_mask, sofa_attention
from posdebias.errors import AdapterError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PROBE_NAME",
    "AttentionRecorder",
    "CrossAttentionSpans",
    "attention_forward",
    "install_probe",
    "recording",
    "register_probe",
    "sofa_attention",
]

PROBE_NAME = "posdebias_probe"


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One attention layer's call: SoFA's mask, shared prefix, probe, SDPA (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    attention_mask = adjust_mask(module, query, key, attention_mask)  # 1. SoFA
    shared = shared_prefix_attention(module, query, key, value, attention_mask, scaling)
    if shared is not None:  # 2. samples decoding over one copy of the prompt
        return shared, None
    recorder = active_recorder()
    if recorder is not None:  # 3. the probe
        recorder.record(module, query, key, attention_mask, scaling)
    return sdpa_attention_forward(  # 4. the layer output
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def register_probe() -> str:
    """Register the probe with transformers (idempotent); returns its implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PROBE_NAME, attention_forward)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)
    return PROBE_NAME


def install_probe(model: Any, text_config_key: str | None = "text_config") -> None:
    """Route the language model's attention through the probe; the vision tower keeps its own.

    ``text_config_key`` names the language model's sub-config; None: the model is a language
    model (its own config). Without an active recorder, SoFA or shared prefix the function is
    plain SDPA, so installing it changes no output.
    """
    register_probe()
    try:
        model.set_attn_implementation(
            PROBE_NAME if text_config_key is None else {text_config_key: PROBE_NAME}
        )
    except (ValueError, AttributeError, KeyError) as exc:
        raise AdapterError(
            f"cannot enable the attention probe on {type(model).__name__}: {exc}"
        ) from exc
    text_config = (
        model.config if text_config_key is None else getattr(model.config, text_config_key, None)
    )
    if text_config is None or text_config._attn_implementation != PROBE_NAME:
        raise AdapterError(
            f"{type(model).__name__} has no {text_config_key!r} sub-config that accepts a custom "
            "attention function; the attention probe needs the AttentionInterface of "
            "transformers >= 5"
        )
