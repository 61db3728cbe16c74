"""The attention probe: per-image attention mass of the last prompt token, from the SDPA pass.

The method (docs/method.md, "Observations") needs, for every language-model layer l and image
k, a^(l)_k = (1/H) sum_h sum_{t in R_k} A^(l,h)[last, t] (post-softmax). Eager attention with
``output_attentions`` materialises every T x T map to get it; instead the posdebias attention
function (:func:`posdebias.adapters.attention.attention_forward`, registered with
``transformers.AttentionInterface`` and the matching mask function with
``AttentionMaskInterface``: without it transformers gives custom implementations no mask and
left padding is silently ignored)

1. delegates the layer output to the stock SDPA function (same kernel, identical logits), and
2. when a recorder is active, recomputes only the LAST query row per head,
   softmax(q_last K^T * scale + mask_last) in float32, handling grouped-query attention by
   reshaping q to [B, H_kv, G, D] instead of repeating K, and reduces it at once to the mass on
   each image span with a precomputed [B, T, N] span matrix.

The extra memory is [B, H, T] float32 scores plus, for half-precision models, a float32 scratch
copy of at most ``KEY_CHUNK`` keys per KV head, allocated once per pass and reused by every
layer: the keys are upcast chunk by chunk, never whole (a fresh float32 copy of a layer's K per
layer cost up to 10% of the forward time on CPU, docs/performance.md). The scores stay float32
(a bfloat16 product rounds the logits by ~0.1). No T x T tensor is ever formed, and the masses
stay on their layer's device until :meth:`AttentionRecorder.attention` gathers them (one
transfer per pass, not a device synchronisation per layer). A model split over devices
(``device_map``) is handled per device: the span matrix and the scratch copy live once on each
device that runs a layer, and the masses are gathered to one device before they are stacked.
Cross-attention layers (Mllama: the text's queries over the vision encoder's tokens, routed
through the same attention interface) are read the same way over their own keys: given
:class:`CrossAttentionSpans`, the recorder reads exactly those layers, each image's mass being
the last prompt token's probability on that image's encoder tokens, and leaves the
self-attention layers unread (there the images are only their placeholder tokens).
The recorder lives in a :class:`contextvars.ContextVar`, so concurrent or nested calls
(threads, asyncio tasks) each see their own and nothing leaks between calls; without an active
recorder the probe is plain SDPA.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from posdebias.core.layers import LayerSet
from posdebias.errors import AdapterError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

KEY_CHUNK = 512  # keys upcast to float32 at a time in half-precision models

_ACTIVE: contextvars.ContextVar[AttentionRecorder | None] = contextvars.ContextVar(
    "posdebias_attention_recorder", default=None
)


def cap_scores(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)`` in place (no cap: unchanged), as Gemma 2's eager
    attention caps the scaled logits before the mask."""
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


@dataclass(frozen=True)
class CrossAttentionSpans:
    """Where the images are for the cross-attention layers of a model that reads its images
    through them (Mllama).

    Attributes:
        layers: the cross-attention layers' indices (``module.layer_idx``).
        matrix: [B, S, N] float32, 1 where key s of those layers (the encoder's tokens, in the
            order the model concatenates them) belongs to image k.
    """

    layers: frozenset[int]
    matrix: torch.Tensor


class AttentionRecorder:
    """Collects the per-image attention mass of the last query row, one entry per layer.

    Args:
        span_matrix: [B, T, N] float32, 1 where token t belongs to image k's span.
        cross: the cross-attention layers and their keys' spans; when given, exactly those
            layers are read (over their keys), the self-attention layers are not.
    """

    def __init__(self, span_matrix: torch.Tensor, cross: CrossAttentionSpans | None = None) -> None:
        import torch

        if span_matrix.ndim != 3 or (cross is not None and cross.matrix.ndim != 3):
            raise AdapterError(
                f"span matrix must be [batch, tokens, images], got {span_matrix.shape}"
            )
        self.cross = cross
        self.span_matrix = span_matrix.to(torch.float32)
        self.masses: dict[int, torch.Tensor] = {}
        self.modules: dict[int, torch.nn.Module] = {}
        # per device: a model split over devices runs layers on several (device_map)
        self._spans: dict[torch.device, torch.Tensor] = {self.span_matrix.device: self.span_matrix}
        self._cross_spans: dict[torch.device, torch.Tensor] = {}
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def record(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
        softcap: float | None = None,
    ) -> None:
        """Record one layer's last-row masses (``softcap``: the layer's logit cap, if any)."""
        import torch

        batch, heads, q_len, dim = query.shape
        kv_heads, kv_len = key.shape[1], key.shape[2]
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise AdapterError(
                f"{type(module).__name__} has no layer_idx; the probe cannot order its layers"
            )
        crossing = self.cross is not None and layer in self.cross.layers
        if self.cross is not None and not crossing:
            return  # a self-attention layer of a cross-attention model: placeholders only
        spans = self.cross.matrix if crossing and self.cross is not None else self.span_matrix
        # A layer may compute only the last queries of the prompt pass (Gemma 4's KV-shared
        # layers skip the rows no later layer reads); its last row is still the last token's.
        # A cross-attention layer's keys are the encoder's tokens, its queries the prompt's.
        prompt = self.span_matrix.shape[1]
        if q_len > prompt or kv_len != spans.shape[1] or (crossing and q_len != prompt):
            raise AdapterError(
                f"attention probe saw {q_len} queries over {kv_len} keys, expected one prompt "
                f"pass of {prompt} tokens (over {spans.shape[1]} keys); record only the prompt "
                "forward"
            )
        if layer in self.masses:
            raise AdapterError(f"attention layer {layer} was recorded twice in one pass")
        groups = heads // kv_heads
        scale = dim**-0.5 if scaling is None else scaling
        # [B, H, D] -> [B, H_kv, G, D]: query heads h = kv * G + g share key head kv.
        q_last = query[:, :, -1, :].to(torch.float32).reshape(batch, kv_heads, groups, dim)
        scores = self._last_row_scores(q_last, key)
        cap_scores(scores.mul_(scale), softcap)
        if attention_mask is not None:
            last_row = attention_mask[:, :, -1, :].to(scores.device)  # [B, 1 or H, T]
            if last_row.shape[1] != 1:
                last_row = last_row.reshape(batch, kv_heads, groups, kv_len)
            else:
                last_row = last_row[:, :, None, :]
            if last_row.dtype == torch.bool:
                scores.masked_fill_(~last_row, float("-inf"))
            else:
                scores.add_(last_row.to(torch.float32))
        probabilities = torch.softmax(scores, dim=-1)  # [B, H_kv, G, T]
        head_mean = probabilities.sum(dim=(1, 2)) / heads  # [B, T]
        span = self._span_on(head_mean.device, crossing)
        self.masses[layer] = torch.bmm(head_mean[:, None, :], span)[:, 0, :]
        self.modules[layer] = module

    def _last_row_scores(self, q_last: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """[B, H_kv, G, T] float32 q_last K^T, upcasting half-precision keys chunk by chunk."""
        import torch

        if key.dtype == torch.float32:
            return torch.matmul(q_last, key.transpose(-1, -2))
        batch, kv_heads, kv_len, dim = key.shape
        scores = torch.empty(
            (batch, kv_heads, q_last.shape[2], kv_len), dtype=torch.float32, device=key.device
        )
        chunk = min(KEY_CHUNK, kv_len)
        scratch = self._scratch.get(key.device)  # one per device: layers may sit on several
        if scratch is None or scratch.shape != (batch, kv_heads, chunk, dim):
            scratch = torch.empty(
                (batch, kv_heads, chunk, dim), dtype=torch.float32, device=key.device
            )
            self._scratch[key.device] = scratch
        for start in range(0, kv_len, chunk):
            stop = min(start + chunk, kv_len)
            part = scratch[:, :, : stop - start]
            part.copy_(key[:, :, start:stop])
            scores[..., start:stop] = torch.matmul(q_last, part.transpose(-1, -2))
        return scores

    def _span_on(self, device: torch.device, crossing: bool = False) -> torch.Tensor:
        """The span matrix (of the cross-attention keys when ``crossing``) on ``device``,
        copied there once per pass and device."""
        import torch

        copies = self._cross_spans if crossing else self._spans
        span = copies.get(device)
        if span is None:
            source = self.cross.matrix if crossing and self.cross is not None else self.span_matrix
            span = copies[device] = source.to(device, torch.float32)
        return span

    @property
    def recorded_layers(self) -> list[int]:
        """Model layer indices the probe read in this pass, ascending."""
        return sorted(self.masses)

    def attention(self, layers: LayerSet | int) -> torch.Tensor:
        """[B, L, N] masses, one row per layer of ``layers`` in its order (an int L: layers
        0..L-1). Exactly those layers must have been recorded, each once: a layer the config
        says has softmax attention that never reached the probe, or one it says has none that
        did, is an error, never a silently missing or extra row."""
        import torch

        expected = list(range(layers)) if isinstance(layers, int) else list(layers.indices)
        if self.recorded_layers != expected:
            raise AdapterError(
                f"attention probe recorded layers {self.recorded_layers}, expected {expected} "
                "(the softmax-attention layers of the text config's layer_types); is the "
                "language model using the probe (set_attn_implementation)?"
            )
        # gathered on the CPU: with a split model the layers' masses sit on several devices
        return torch.stack([self.masses[layer].cpu() for layer in expected], dim=1)


@contextlib.contextmanager
def scoped(variable: contextvars.ContextVar[T | None], value: T) -> Iterator[T]:
    """``variable`` set to ``value`` inside this block only: how the probe, SoFA and shared-prefix
    decoding are switched on (each thread or task sees its own; nothing leaks after the block)."""
    token = variable.set(value)
    try:
        yield value
    finally:
        variable.reset(token)


def recording(
    span_matrix: torch.Tensor, cross: CrossAttentionSpans | None = None
) -> contextlib.AbstractContextManager[AttentionRecorder]:
    """Record the probe inside this block only (one forward pass of the prompt)."""
    return scoped(_ACTIVE, AttentionRecorder(span_matrix, cross))


def active_recorder() -> AttentionRecorder | None:
    """The recorder of the innermost :func:`recording` block of this context, if any."""
    return _ACTIVE.get()
