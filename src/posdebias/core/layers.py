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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
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
"""Family-wise level of the test that a chosen layer beats chance (over every candidate layer
and reading at once): below it, no layer is called informative."""

RELABELINGS = 2000
"""Random relabelings of the truth behind the chance test where there are more distinct ones
(N ** instances); fewer are enumerated exactly."""

EPSILON = 1e-20
"""Guard for every log of an attention mass or probability (docs/method.md, Inference step 2)."""

_CELLS_PER_CHUNK = 20_000_000  # relabelings x views x rows compared at once (bounds memory)


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
        p_value: share of the relabelings of the truth (per instance) in which some candidate
            row, under some reading tried, is right as often as the best row or more.
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
    readings: Mapping[str, np.ndarray],
    targets: np.ndarray,
    groups: np.ndarray,
    candidates: np.ndarray,
    top_k: int,
) -> LayerChoice:
    """At most K candidate rows whose purified attention most often points at the truth, under
    the reading of the candidates' attention that finds the most.

    ``readings`` maps each reading tried (:data:`SPAN_READINGS`) to the calibration views'
    masses [V, L, N] as :func:`span_masses` reads them (ties between readings go to the first);
    ``targets`` [V] where the truth is; ``groups`` [V] which instance each view shows: the
    views of one instance are its cyclic rotations. Each view is scored against the static
    prior of the OTHER views, so a view does not vouch for itself; ties go to the row whose
    posterior gives the truth more mass, then to the lower row.

    The chance test counts instances, not views: a layer that follows one option's content
    (its length, a distractor) is right in all N rotations of an instance or in none, so its
    views are not independent trials. Under the null hypothesis the attention does not know
    which option is right, and relabelling the truth of an instance as the option d places
    further on (the same option in all its rotations, d drawn per instance) leaves the chance
    of every count unchanged. The p-value of a row is the share of relabelings in which the
    best count over EVERY candidate row and reading reaches the row's own (the max statistic:
    corrected for all the layers and readings tried at once; Westfall and Young 1993).
    """
    names = list(readings)
    first = readings[names[0]]
    rows, n = first.shape[1], first.shape[2]
    scored = {name: _score_rows(readings[name], targets) for name in names}
    right = {name: (picks == targets[:, None]).sum(axis=0) for name, (picks, _) in scored.items()}

    def ranked(name: str) -> list[int]:
        mass = scored[name][1]
        return sorted(candidates.tolist(), key=lambda row: (-right[name][row], -mass[row], row))

    reading = max(names, key=lambda name: right[name][ranked(name)[0]])  # first of equals
    order = ranked(reading)
    picks = np.concatenate([scored[name][0][:, candidates] for name in names], axis=1)
    null = _null_best_counts(picks, targets, groups, n)

    def p_value(row: int) -> float:
        return float(np.mean(null >= right[reading][row]))

    # of the top K, those that beat chance themselves (a weak second layer only dilutes the
    # first); at least the best, which the fallback judges
    passing = [row for row in order[:top_k] if p_value(row) < CHANCE_ALPHA]
    views = targets.size
    accuracy = np.full(rows, np.nan)
    accuracy[candidates] = right[reading][candidates] / views
    p_best = p_value(order[0])
    return LayerChoice(
        rows=tuple(sorted(passing or order[:1])),
        accuracy=tuple(float(a) for a in accuracy),
        p_value=p_best,
        informative=p_best < CHANCE_ALPHA,
        views=views,
        span_mass=reading,
    )


def _score_rows(masses: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per view and row, the position the purified attention points at [V, L], and per row the
    posterior mass on the truth summed over the views [L] (rounded, so that summation order
    cannot flip a tie); each view against the static prior of the other views."""
    views = masses.shape[0]
    total = np.sort(masses, axis=0).sum(axis=0)  # in sorted order: independent of view order
    prior = (total - masses) / (views - 1) if views > 1 else masses
    purified = np.log(masses + EPSILON) - np.log(prior + EPSILON)  # [V, L, N]
    shifted = np.exp(purified - purified.max(axis=2, keepdims=True))
    posterior = shifted / shifted.sum(axis=2, keepdims=True)
    truth_mass = posterior[np.arange(views), :, targets].sum(axis=0)
    return purified.argmax(axis=2), np.round(truth_mass, 9)


def _null_best_counts(
    picks: np.ndarray, targets: np.ndarray, groups: np.ndarray, n: int
) -> np.ndarray:
    """The best right count over all columns of ``picks`` [V, C] under each relabeling of the
    truth: every one when there are at most :data:`RELABELINGS`, else that many drawn with a
    fixed seed plus the identity (so a p-value is never 0). The null distribution of
    :func:`choose_layers`' test."""
    _, group_of_view = np.unique(groups, return_inverse=True)
    count = int(group_of_view.max()) + 1
    if count * np.log(n) <= np.log(RELABELINGS):
        offsets = np.array(list(product(range(n), repeat=count)), dtype=np.int64)
    else:
        drawn = np.random.default_rng(0).integers(0, n, size=(RELABELINGS, count))
        offsets = np.vstack([np.zeros((1, count), dtype=np.int64), drawn])
    chunk = max(1, _CELLS_PER_CHUNK // max(1, picks.size))
    best = np.empty(len(offsets), dtype=np.int64)
    for start in range(0, len(offsets), chunk):
        relabelled = (targets[None, :] + offsets[start : start + chunk][:, group_of_view]) % n
        hits = picks[None, :, :] == relabelled[:, :, None]  # [r, V, C]
        best[start : start + chunk] = hits.sum(axis=1).max(axis=1)
    return best
