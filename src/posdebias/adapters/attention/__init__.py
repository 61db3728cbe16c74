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
    cap_scores,
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
    "language_model_attention",
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
    """One attention layer's call: SoFA's mask, shared prefix, probe, SDPA (module docstring).

    A layer that soft-caps its logits (``softcap``: Gemma 2, PaliGemma 2) gets the cap in all
    three and its output from :func:`softcapped_attention` (SDPA has no cap); a layer with
    attention sinks (``s_aux``) is refused rather than computed without them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = kwargs.get("softcap")
    if kwargs.get("s_aux") is not None:
        raise AdapterError(
            f"{type(module).__name__} adds attention sinks (s_aux), which the posdebias "
            "attention function does not reproduce; this model is not supported"
        )
    attention_mask = adjust_mask(module, query, key, attention_mask)  # 1. SoFA
    shared = shared_prefix_attention(module, query, key, value, attention_mask, scaling, softcap)
    if shared is not None:  # 2. samples decoding over one copy of the prompt
        return shared, None
    recorder = active_recorder()
    if recorder is not None:  # 3. the probe
        recorder.record(module, query, key, attention_mask, scaling, softcap)
    if softcap is not None:
        output = softcapped_attention(module, query, key, value, attention_mask, scaling, softcap)
        return output, None
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


def softcapped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float,
) -> torch.Tensor:
    """[B, q, H, D] output of a soft-capped attention layer: the full score matrix, as the
    family's own eager attention computes it (SDPA cannot cap; prompts here are short)."""
    import torch

    heads, dim = query.shape[1], query.shape[3]
    groups = heads // key.shape[1]
    keys = key.repeat_interleave(groups, dim=1)
    values = value.repeat_interleave(groups, dim=1)
    scale = dim**-0.5 if scaling is None else scaling
    scores = cap_scores(torch.matmul(query, keys.transpose(2, 3)) * scale, softcap)
    if attention_mask is not None:
        mask = attention_mask[..., : keys.shape[2]]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, values).transpose(1, 2).contiguous()


def register_probe() -> str:
    """Register the probe with transformers (idempotent); returns its implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PROBE_NAME, attention_forward)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)
    return PROBE_NAME


def language_model_attention(
    model: Any, text_config_key: str | None, implementation: str
) -> dict[str, Any]:
    """The ``set_attn_implementation`` argument that gives the language model
    ``implementation`` and leaves every encoder's as it is (``text_config_key`` as for
    :func:`install_probe`)."""
    if text_config_key is not None:
        return {text_config_key: implementation}
    config = model.config
    encoders = {
        key: sub._attn_implementation
        for key in getattr(config, "sub_configs", {})
        if (sub := getattr(config, key, None)) is not None
    }
    return {"": implementation, **encoders}


def install_probe(model: Any, text_config_key: str | None = "text_config") -> None:
    """Route the language model's attention through the probe; the vision tower keeps its own.

    ``text_config_key`` names the language model's sub-config; None: the model is a language
    model (its own config), whose own sub-configs (Phi-4-multimodal's vision and audio
    encoders) keep their implementation. Without an active recorder, SoFA or shared prefix the
    function is plain SDPA, so installing it changes no output.
    """
    register_probe()
    try:
        model.set_attn_implementation(language_model_attention(model, text_config_key, PROBE_NAME))
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
            "attention function, and the attention probe reads the language model through "
            "transformers' AttentionInterface; a family adapter must name the language model's "
            "config (text_config_key)"
        )
