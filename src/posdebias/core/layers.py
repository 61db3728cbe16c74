"""Which model layers an observation's attention rows come from, and what kind each one is.

Dense models have one softmax attention per layer over the whole prompt: their rows are layers
0..L-1, all ``global``. Hybrid models read fewer rows: Qwen3.5's linear-attention (Gated
DeltaNet) layers have no attention matrix at all, so only its full-attention layers give a row;
Gemma 3's sliding-window layers and Llama 4's chunked layers do have softmax attention, but the
last prompt token sees only the last window / chunk of the prompt, so an image outside it gets
zero mass for a structural reason. The kind of each row lets layer selection keep to the layers
whose attention can see every image (docs/method.md, "Inference", step 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from math import comb, exp, log
from typing import Any

import numpy as np

from posdebias.errors import ObservationError

GLOBAL = "global"
SLIDING = "sliding"
CHUNKED = "chunked"
LAYER_KINDS: tuple[str, ...] = (GLOBAL, SLIDING, CHUNKED)
"""Kinds of softmax-attention layers: ``global`` sees every earlier token, ``sliding`` the last
``window`` tokens, ``chunked`` the tokens of its own fixed-size chunk."""


@dataclass(frozen=True)
class LayerSet:
    """The model layers behind the rows of an attention array, in row order.

    Attributes:
        indices: model layer index of each row, strictly increasing.
        kinds: kind of each row (one of :data:`LAYER_KINDS`).
    """

    indices: tuple[int, ...]
    kinds: tuple[str, ...]

    def __post_init__(self) -> None:
        indices = tuple(_as_index(value) for value in self.indices)
        kinds = tuple(self.kinds)
        if not indices:
            raise ObservationError("an attention layer set needs at least one layer")
        if len(kinds) != len(indices):
            raise ObservationError(
                f"attention layers: {len(indices)} indices but {len(kinds)} kinds"
            )
        if any(b <= a for a, b in pairwise(indices)):
            raise ObservationError(
                f"attention layer indices must be strictly increasing, got {list(indices)}"
            )
        unknown = sorted({str(kind) for kind in kinds if kind not in LAYER_KINDS})
        if unknown:
            raise ObservationError(
                f"unknown attention layer kind(s) {unknown}; known: {', '.join(LAYER_KINDS)}"
            )
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "kinds", kinds)

    @classmethod
    def dense(cls, num_layers: int) -> LayerSet:
        """Every layer 0..L-1, all global: a dense model (and every state saved before layer
        sets existed)."""
        return cls(tuple(range(num_layers)), (GLOBAL,) * num_layers)

    @classmethod
    def from_lists(
        cls, indices: Sequence[Any] | None, kinds: Sequence[Any] | None, rows: int
    ) -> LayerSet:
        """The layer set of ``rows`` attention rows; missing indices and kinds mean dense."""
        if indices is None and kinds is None:
            return cls.dense(rows)
        if indices is None or kinds is None:
            raise ObservationError(
                "attention layers need both their indices and their kinds (or neither, for a "
                "dense model)"
            )
        if not isinstance(indices, (list, tuple)) or not isinstance(kinds, (list, tuple)):
            raise ObservationError(
                f"attention layers and their kinds must be lists, got {indices!r} and {kinds!r}"
            )
        layers = cls(tuple(indices), tuple(kinds))
        if len(layers) != rows:
            raise ObservationError(
                f"attention has {rows} rows but its layer set names {len(layers)} layers "
                f"({layers.describe()})"
            )
        return layers

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def is_dense(self) -> bool:
        """All layers 0..L-1, all global."""
        return self == LayerSet.dense(len(self))

    def rows_of_kinds(self, kinds: Iterable[str]) -> list[int]:
        """Row positions whose kind is in ``kinds``."""
        wanted = set(kinds)
        return [row for row, kind in enumerate(self.kinds) if kind in wanted]

    def describe(self) -> str:
        """Short human form, e.g. ``layers 3, 7, 11 (global)`` or ``layers 0-5 (4 sliding,
        2 global)``, used in error messages."""
        indices = list(self.indices)
        if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
            where = f"layers {indices[0]}-{indices[-1]}"
        else:
            where = "layers " + ", ".join(str(i) for i in indices)
        counts = {kind: self.kinds.count(kind) for kind in LAYER_KINDS if kind in self.kinds}
        if len(counts) == 1:
            what = next(iter(counts))
        else:
            what = ", ".join(f"{count} {kind}" for kind, count in counts.items())
        return f"{where} ({what})"

    def to_dict(self) -> dict[str, list[Any]]:
        return {"layers": list(self.indices), "layer_kinds": list(self.kinds)}


def _as_index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ObservationError(f"attention layer indices must be integers, got {value!r}")
    if value < 0:
        raise ObservationError(f"attention layer indices must be non-negative, got {value}")
    return int(value)


# -- layer choice from calibration evidence ------------------------------------------------

SPAN_READINGS = ("mean", "sum")
"""How a candidate's attention mass can be read: ``mean`` per token (longer candidates are not
favoured for their length) or ``sum`` over its tokens (the paper). Where the calibration evidence
chooses between them, a tie goes to the first."""

CHANCE_ALPHA = 0.05
"""Family-wise level of the test that the chosen layer beats chance (Bonferroni over the
candidate layers): below it, no layer is called informative."""

_EPSILON = 1e-20


def span_masses(
    attention: np.ndarray, span_lengths: np.ndarray | None, span_mass: str
) -> np.ndarray:
    """Attention rows as ``span_mass`` reads them: summed masses as observed, or divided by each
    candidate's token count (``mean``; observations without lengths are read as summed)."""
    if span_mass == "sum" or span_lengths is None:
        return attention
    return attention / span_lengths


@dataclass(frozen=True)
class LayerChoice:
    """Layers chosen from calibration evidence, and whether any of them is informative.

    Attributes:
        rows: attention-row positions chosen (ascending): of the top K by accuracy, those that
            beat chance on their own (at least the best one).
        accuracy: per candidate row, the cross-validated share of calibration views whose
            purified attention points at the truth (NaN for rows that are not candidates).
        p_value: probability of the best row's count of right views or more under chance
            (1/N per view), times the number of candidate rows (Bonferroni), at most 1.
        informative: whether ``p_value`` is below :data:`CHANCE_ALPHA`.
        views: number of calibration views scored.
        span_mass: the reading of the candidates' attention (:data:`SPAN_READINGS`) the choice
            was made with, which prediction must use too.
    """

    rows: tuple[int, ...]
    accuracy: tuple[float, ...]
    p_value: float
    informative: bool
    views: int
    span_mass: str

    @property
    def best_accuracy(self) -> float:
        """The best candidate row's share of right calibration views."""
        return float(np.nanmax(np.array(self.accuracy)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
            "accuracy": [None if np.isnan(a) else round(float(a), 6) for a in self.accuracy],
            "p_value": float(self.p_value),
            "informative": self.informative,
            "views": self.views,
            "span_mass": self.span_mass,
        }


def choose_layers(
    masses: np.ndarray,
    targets: np.ndarray,
    groups: np.ndarray,
    candidates: np.ndarray,
    top_k: int,
    *,
    span_mass: str,
    comparisons: int = 1,
) -> LayerChoice:
    """At most K candidate rows whose purified attention most often points at the truth.

    ``masses`` [V, L, N] are the calibration views' attention masses (as :func:`span_masses`
    reads them with ``span_mass``), ``targets`` [V] where the truth is, ``comparisons`` how many
    such choices the caller makes and keeps the best of (one per reading tried: the chance test
    corrects for every candidate row of every one), ``groups`` [V] the views scored together:
    each group is scored against the static prior of the OTHER groups' views, so a view does not
    vouch for itself (the calibrators score each view alone: a fit must not depend on the order
    of its observations); ties go to the row whose posterior gives the truth more mass, then to
    the lower row.
    """
    views, rows, n = masses.shape
    log_masses = np.log(masses + _EPSILON)
    right = np.zeros(rows)
    truth_mass = np.zeros(rows)
    total = masses.sum(axis=0)
    for group in np.unique(groups):
        inside = groups == group
        outside = views - int(inside.sum())
        prior = (total - masses[inside].sum(axis=0)) / outside if outside else total / views
        purified = log_masses[inside] - np.log(prior + _EPSILON)  # [v, L, N]
        truth = targets[inside]
        right += (purified.argmax(axis=2) == truth[:, None]).sum(axis=0)
        shifted = purified - purified.max(axis=2, keepdims=True)
        posterior = np.exp(shifted) / np.exp(shifted).sum(axis=2, keepdims=True)
        truth_mass += posterior[np.arange(truth.size), :, truth].sum(axis=0)
    # the posterior mass is rounded so that summation order cannot flip a tie
    mass = np.round(truth_mass, 9)
    order = sorted(candidates.tolist(), key=lambda row: (-right[row], -mass[row], row))

    def corrected(row: int) -> float:  # Bonferroni over the candidate rows of every comparison
        return min(1.0, _binomial_tail(int(right[row]), views, 1.0 / n) * len(order) * comparisons)

    # of the top K, those that beat chance themselves (a weak second layer only dilutes the
    # first); at least the best, which the fallback judges
    passing = [row for row in order[:top_k] if corrected(row) < CHANCE_ALPHA]
    chosen = tuple(sorted(passing or order[:1]))
    accuracy = np.full(rows, np.nan)
    accuracy[candidates] = right[candidates] / views
    p_value = corrected(order[0])
    return LayerChoice(
        rows=chosen,
        accuracy=tuple(float(a) for a in accuracy),
        p_value=p_value,
        informative=p_value < CHANCE_ALPHA,
        views=views,
        span_mass=span_mass,
    )


def _binomial_tail(successes: int, trials: int, chance: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, chance), exactly (in log space)."""
    if successes <= 0:
        return 1.0
    terms = [
        log(comb(trials, k)) + k * log(chance) + (trials - k) * log(1.0 - chance)
        for k in range(successes, trials + 1)
    ]
    top = max(terms)
    return float(min(1.0, exp(top) * sum(exp(t - top) for t in terms)))
