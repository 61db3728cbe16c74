"""The attention probe: per-image attention mass of the last prompt token, from the SDPA pass.

METHOD.md "Observations" needs, for every language-model layer l and image k,
a^(l)_k = (1/H) sum_h sum_{t in R_k} A^(l,h)[last, t] (post-softmax). Eager attention with
``output_attentions`` materialises every T x T map to get it; instead this module registers an
attention function with ``transformers.AttentionInterface`` (and the matching mask function with
``AttentionMaskInterface``: without it transformers gives custom implementations no mask and
left padding is silently ignored). The function

1. delegates the layer output to the stock SDPA function (same kernel, identical logits), and
2. when a recorder is active, recomputes only the LAST query row per head,
   softmax(q_last K^T * scale + mask_last) in float32, handling grouped-query attention by
   reshaping q to [B, H_kv, G, D] instead of repeating K, and reduces it at once to the mass on
   each image span with a precomputed [B, T, N] span matrix.

The extra memory is one [B, H_kv, T, D] float32 copy of one layer's keys plus [B, H, T] scores,
freed before the next layer; no T x T tensor is ever formed. The recorder lives in a
:class:`contextvars.ContextVar`, so concurrent or nested calls (threads, asyncio tasks) each see
their own and nothing leaks between calls; without an active recorder the probe is plain SDPA.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

from posdebias.errors import AdapterError

PROBE_NAME = "posdebias_probe"

_ACTIVE: contextvars.ContextVar[AttentionRecorder | None] = contextvars.ContextVar(
    "posdebias_attention_recorder", default=None
)


class AttentionRecorder:
    """Collects the per-image attention mass of the last query row, one entry per layer.

    Args:
        span_matrix: [B, T, N] float32, 1 where token t belongs to image k's span.
    """

    def __init__(self, span_matrix: torch.Tensor) -> None:
        if span_matrix.ndim != 3:
            raise AdapterError(
                f"span matrix must be [batch, tokens, images], got {span_matrix.shape}"
            )
        self.span_matrix = span_matrix.to(torch.float32)
        self.masses: dict[int, torch.Tensor] = {}
        self.modules: dict[int, torch.nn.Module] = {}

    def record(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
    ) -> None:
        batch, heads, q_len, dim = query.shape
        kv_heads, kv_len = key.shape[1], key.shape[2]
        if q_len != kv_len or kv_len != self.span_matrix.shape[1]:
            raise AdapterError(
                f"attention probe saw {q_len} queries over {kv_len} keys, expected one prompt "
                f"pass of {self.span_matrix.shape[1]} tokens; record only the prompt forward"
            )
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise AdapterError(
                f"{type(module).__name__} has no layer_idx; the probe cannot order its layers"
            )
        if layer in self.masses:
            raise AdapterError(f"attention layer {layer} was recorded twice in one pass")
        groups = heads // kv_heads
        scale = dim**-0.5 if scaling is None else scaling
        # [B, H, D] -> [B, H_kv, G, D]: query heads h = kv * G + g share key head kv.
        q_last = query[:, :, -1, :].to(torch.float32).reshape(batch, kv_heads, groups, dim)
        scores = torch.matmul(q_last, key.to(torch.float32).transpose(-1, -2)) * scale
        if attention_mask is not None:
            last_row = attention_mask[:, :, -1, :].to(scores.device)  # [B, 1 or H, T]
            if last_row.shape[1] != 1:
                last_row = last_row.reshape(batch, kv_heads, groups, kv_len)
            else:
                last_row = last_row[:, :, None, :]
            if last_row.dtype == torch.bool:
                scores = scores.masked_fill(~last_row, float("-inf"))
            else:
                scores = scores + last_row.to(torch.float32)
        probabilities = torch.softmax(scores, dim=-1)  # [B, H_kv, G, T]
        head_mean = probabilities.sum(dim=(1, 2)) / heads  # [B, T]
        span = self.span_matrix.to(head_mean.device)
        self.masses[layer] = torch.bmm(head_mean[:, None, :], span)[:, 0, :].cpu()
        self.modules[layer] = module

    def attention(self, num_layers: int) -> torch.Tensor:
        """[B, L, N] masses ordered by layer index; every layer must have been recorded once."""
        if sorted(self.masses) != list(range(num_layers)):
            raise AdapterError(
                f"attention probe recorded layers {sorted(self.masses)}, expected "
                f"0..{num_layers - 1}; is the language model using the probe "
                "(set_attn_implementation)?"
            )
        return torch.stack([self.masses[layer] for layer in range(num_layers)], dim=1)


def probe_attention_forward(
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
    """SDPA output, plus the last-row record when a recorder is active (see the module doc)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.record(module, query, key, attention_mask, scaling)
    return sdpa_attention_forward(
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

    AttentionInterface.register(PROBE_NAME, probe_attention_forward)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)
    return PROBE_NAME


def install_probe(model: Any, text_config_key: str = "text_config") -> None:
    """Route the language model's attention through the probe; the vision tower keeps its own.

    Without an active recorder the probe is plain SDPA, so installing it changes no output.
    """
    register_probe()
    try:
        model.set_attn_implementation({text_config_key: PROBE_NAME})
    except (ValueError, AttributeError, KeyError) as exc:
        raise AdapterError(
            f"cannot enable the attention probe on {type(model).__name__}: {exc}"
        ) from exc
    text_config = getattr(model.config, text_config_key, None)
    if text_config is None or text_config._attn_implementation != PROBE_NAME:
        raise AdapterError(
            f"{type(model).__name__} has no {text_config_key!r} sub-config that accepts a custom "
            "attention function; the attention probe needs the AttentionInterface of "
            "transformers >= 5"
        )


@contextlib.contextmanager
def recording(span_matrix: torch.Tensor) -> Iterator[AttentionRecorder]:
    """Record the probe inside this block only (one forward pass of the prompt)."""
    recorder = AttentionRecorder(span_matrix)
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
