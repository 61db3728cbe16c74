"""SoFA (Tian et al., CVPR 2025): open the attention between candidate blocks in chosen layers.

In a causal model candidate i (an image, or a text option) cannot see a LATER candidate j. SoFA
replaces, in every ``layer_stride``-th language-model layer (starting at ``first_layer``), the
causal mask's entries from the tokens of candidate i to the tokens of every later candidate j > i,
which are -inf, by log(sigma): the earlier candidate now attends to the later ones with weight
sigma relative to a visible token. With ``within_candidate`` (the authors' code) the masked
entries inside one candidate are opened too: a token of candidate i also sees the LATER tokens
of candidate i with weight sigma. Everything else (text, padding, what is already visible) keeps
the causal mask.

No model code is patched. The posdebias attention function (:mod:`posdebias.adapters.attention`)
asks :func:`adjust_mask` for the mask of each layer; it returns the incoming mask unchanged unless
:func:`sofa_attention` is active AND a prompt pass with known candidate spans is running
(:func:`sofa_scope`, entered by the adapter around its prompt forward). Decoding steps (one new
query over the cache) are never changed: a new token is no candidate, so SoFA has nothing to
open there; its effect lives in the cached keys and values of the prompt pass. The float mask is
built once per pass and shared by the chosen layers.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from posdebias.adapters.attention.probe import scoped
from posdebias.adapters.base import SofaSettings
from posdebias.errors import AdapterError

if TYPE_CHECKING:
    import torch


class HasRuns(Protocol):
    """A candidate's token runs (``posdebias.adapters.hf.ImageSpan``): half-open [start, end)."""

    @property
    def runs(self) -> tuple[tuple[int, int], ...]: ...


#: One candidate's tokens: an object with ``runs`` or a plain ``(start, end)`` pair.
SpanLike = HasRuns | tuple[int, int]


def _runs(span: SpanLike) -> tuple[tuple[int, int], ...]:
    if isinstance(span, Sequence):  # a plain (start, end) pair
        start, end = span
        return ((int(start), int(end)),)
    return span.runs


def sofa_mask(
    mask: torch.Tensor | None,
    spans: Sequence[Sequence[SpanLike]],
    length: int,
    sigma: float,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    within_candidate: bool = False,
) -> torch.Tensor:
    """The [B, 1, T, T] additive float mask: ``mask`` (bool, float or None = causal) with the
    candidate-to-later-candidate blocks set to log(sigma), and with ``within_candidate`` also
    the masked (upper-triangle) entries of each candidate's own block. A row with no visible
    key (a padding row) sees every key, so no softmax row is all -inf (its output is never
    read)."""
    import torch

    batch = len(spans)
    device = mask.device if mask is not None else device
    if mask is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        additive = torch.zeros(length, length, dtype=dtype, device=device)
        additive = additive.masked_fill(~allowed, float("-inf"))[None, None]
    elif mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=dtype, device=device)
        additive = additive.masked_fill(~mask, float("-inf"))
    else:
        additive = mask.to(dtype).clone()
    additive = additive.expand(batch, 1, length, length).clone()
    opened = math.log(sigma)
    for row, row_spans in enumerate(spans):
        runs = [_runs(span) for span in row_spans]  # a candidate may be several runs
        for i, runs_i in enumerate(runs):
            for runs_j in runs[i + 1 :]:
                for start_i, end_i in runs_i:
                    for start_j, end_j in runs_j:
                        additive[row, 0, start_i:end_i, start_j:end_j] = opened
            if within_candidate:
                for start_i, end_i in runs_i:
                    for start_j, end_j in runs_i:
                        block = additive[row, 0, start_i:end_i, start_j:end_j]
                        block.masked_fill_(torch.isneginf(block), opened)
    blocked = torch.isneginf(additive).all(dim=-1, keepdim=True)
    return additive.masked_fill(blocked, 0.0)


@dataclass
class SofaRun:
    """What happened inside one :func:`sofa_attention` block: the layers whose mask was
    replaced (empty means SoFA never took effect: the caller must not report it as SoFA) and,
    when capturing (tests), the mask every layer of the last prompt pass used."""

    settings: SofaSettings
    changed_layers: set[int]
    capture: dict[int, Any] | None = None


class _Scope:
    """One prompt pass under SoFA: its spans and the mask built for it."""

    def __init__(self, run: SofaRun, spans: Sequence[Sequence[SpanLike]], length: int) -> None:
        self.run = run
        self.settings = run.settings
        self.spans = spans
        self.length = length
        self._built: dict[Any, tuple[Any, torch.Tensor]] = {}

    def mask_for(self, mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
        """The SoFA mask on the query's device (built once per source mask, dtype and device:
        a model split over devices runs its layers on several)."""
        key = (query.device, query.dtype)
        cached = self._built.get(key)
        if cached is None or cached[0] is not mask:
            source = None if mask is None else mask.to(query.device)
            built = sofa_mask(
                source,
                self.spans,
                self.length,
                self.settings.sigma,
                query.dtype,
                query.device,
                within_candidate=self.settings.within_candidate,
            )
            cached = self._built[key] = (mask, built)
        return cached[1]


_RUN: contextvars.ContextVar[SofaRun | None] = contextvars.ContextVar(
    "posdebias_sofa_run", default=None
)
_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "posdebias_sofa_scope", default=None
)


def sofa_attention(
    settings: SofaSettings, *, capture: dict[int, Any] | None = None
) -> contextlib.AbstractContextManager[SofaRun]:
    """Run the adapter's prompt passes under SoFA inside this block.

    ``capture`` (tests): receives, per layer index, the mask each layer of the prompt pass used.
    """
    return scoped(_RUN, SofaRun(settings, set(), capture))


@contextlib.contextmanager
def sofa_scope(
    spans: Sequence[Sequence[SpanLike]], length: int, *, images_in_prompt: bool = True
) -> Iterator[None]:
    """Entered by the adapter around a prompt forward of ``length`` tokens with these image
    spans; a no-op unless :func:`sofa_attention` is active. ``images_in_prompt=False`` (a model
    that reads its images through cross-attention layers): SoFA does not apply, an error."""
    run = _RUN.get()
    if run is None:
        yield
        return
    if not images_in_prompt:
        raise AdapterError(
            "SoFA opens the attention between the images' tokens in the prompt; this model "
            "reads its images through cross-attention layers (the prompt holds one placeholder "
            "token per image), so SoFA does not apply to it"
        )
    with scoped(_SCOPE, _Scope(run, spans, length)):
        yield


def adjust_mask(
    module: Any, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor | None:
    """The mask this attention layer should use (see the module docstring)."""
    scope = _SCOPE.get()
    if scope is None:
        return mask
    if query.shape[2] != scope.length or key.shape[2] != scope.length:
        return mask  # a decoding step, not the prompt pass
    layer = getattr(module, "layer_idx", None)
    result = mask
    if layer is not None and scope.settings.applies_to(layer):
        result = scope.mask_for(mask, query)
        scope.run.changed_layers.add(layer)
    if scope.run.capture is not None and layer is not None:
        scope.run.capture[layer] = result
    return result
