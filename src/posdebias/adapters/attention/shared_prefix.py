"""Several samples of one prompt decoded over ONE copy of the prompt's keys and values.

Self-consistency draws 10 chains from one prompt. Repeating the prompt's KV cache 10 times
(``batch_repeat_interleave``) makes every decoding step read 10 copies of the prompt's keys and
values, which on long multi-image prompts costs several times one chain. Here each layer of the
cache keeps the prompt's keys and values once per instance (``SharedPrefixLayer``) and only the
samples' own new tokens per sample; the posdebias attention function
(:mod:`~posdebias.adapters.attention`) asks :func:`shared_prefix_attention` first, which attends
each sample's query to the shared prompt keys and to its own new keys in one softmax (float32, like
the probe), and otherwise leaves the call to SDPA. No model code is patched; the cache stays a
transformers ``DynamicCache`` whose layers report the full length (prompt + new tokens), so masks
and positions are unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import TYPE_CHECKING, Any

from posdebias.adapters.attention.probe import cap_scores, scoped

if TYPE_CHECKING:
    import torch

_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "posdebias_shared_prefix_cache", default=None
)


@functools.cache
def layer_class() -> type[Any]:
    """:class:`SharedPrefixLayer`, defined on first use (it subclasses a transformers class,
    and this module must stay importable without torch)."""
    import torch
    from transformers.cache_utils import DynamicLayer

    class SharedPrefixLayer(DynamicLayer):
        """One cache layer: prompt keys/values [B, H_kv, T, D] once, new ones [B*S, H_kv, t,
        D]; reports the full length (prompt + new tokens) so masks and positions are right."""

        def __init__(
            self, prefix_keys: torch.Tensor, prefix_values: torch.Tensor, samples: int
        ) -> None:
            super().__init__()
            self.prefix_keys = prefix_keys.to(torch.float32)
            self.prefix_values = prefix_values.to(torch.float32)
            self.samples = samples
            self.prefix_length = prefix_keys.shape[-2]
            batch, heads, _, dim = prefix_keys.shape
            empty = prefix_keys.new_empty((batch * samples, heads, 0, dim))
            self.keys, self.values = empty, empty.clone()
            self.device = prefix_keys.device
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values  # the new tokens only; the prompt is in the layer

        def get_seq_length(self) -> int:
            return int(self.prefix_length + self.keys.shape[-2])

    return SharedPrefixLayer


def share_prefix(cache: Any, samples: int) -> bool:
    """Turn a prompt's DynamicCache into shared-prefix layers for ``samples`` samples per row.

    Returns False (cache untouched) when a layer is not a plain dynamic layer (sliding windows,
    linear attention): the caller then repeats the cache instead.
    """
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    shared = layer_class()
    cache.layers = [shared(layer.keys, layer.values, samples) for layer in layers]
    return True


def decoding_over(cache: Any) -> contextlib.AbstractContextManager[Any]:
    """Decoding steps inside this block attend through the shared prefix of ``cache``."""
    return scoped(_ACTIVE, cache)


def shared_prefix_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None = None,
) -> torch.Tensor | None:
    """[B*S, q, H, D] attention output over the shared prompt plus each sample's own tokens,
    or None when no shared-prefix decoding is active for this layer (then SDPA runs)."""
    cache = _ACTIVE.get()
    if cache is None:
        return None
    import torch

    layer_index = getattr(module, "layer_idx", None)
    if layer_index is None or layer_index >= len(cache.layers):
        return None
    layer: Any = cache.layers[layer_index]
    if not isinstance(layer, layer_class()) or key.shape[2] != layer.keys.shape[2]:
        return None
    rows, heads, q_len, dim = query.shape
    samples, kv_heads, new = layer.samples, key.shape[1], key.shape[2]
    batch, groups, prompt = rows // samples, heads // kv_heads, layer.prefix_length
    scale = dim**-0.5 if scaling is None else scaling
    q = query.to(torch.float32).reshape(batch, samples, kv_heads, groups, q_len, dim)
    own_keys = key.to(torch.float32).reshape(batch, samples, kv_heads, new, dim)
    own_values = value.to(torch.float32).reshape(batch, samples, kv_heads, new, dim)
    scores = torch.cat(
        [
            torch.einsum("bskgqd,bktd->bskgqt", q, layer.prefix_keys),
            torch.einsum("bskgqd,bsktd->bskgqt", q, own_keys),
        ],
        dim=-1,
    ).mul_(scale)
    cap_scores(scores, softcap)
    if attention_mask is not None:
        mask = attention_mask[..., -(prompt + new) :]
        per_head = (kv_heads, groups) if mask.shape[1] != 1 else (1, 1)
        mask = mask.reshape(batch, samples, *per_head, q_len, prompt + new).to(scores.device)
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.to(torch.float32))
    probabilities = torch.softmax(scores, dim=-1)
    output = torch.einsum(
        "bskgqt,bktd->bskgqd", probabilities[..., :prompt], layer.prefix_values
    ) + torch.einsum("bskgqt,bsktd->bskgqd", probabilities[..., prompt:], own_values)
    output = output.reshape(rows, heads, q_len, dim).to(query.dtype)
    return output.transpose(1, 2).contiguous()
