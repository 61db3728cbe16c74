"""The logit-attention divergence picture: per truth position, where the label probabilities,
the raw attention and the purified attention point (mean over test observations); and per
attention layer, how much of its attention goes to the right image and how much to the position
its static prior favours, before and after purification."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, Field

import posdebias.defaults as defaults
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import LayerSelectionOptions
from posdebias.core.instance import Instance
from posdebias.core.layers import LayerSet
from posdebias.core.observation import Observation
from posdebias.core.stages import EPSILON, Corrector, LayerSelector, mean_attention
from posdebias.core.state import CalibrationState
from posdebias.evaluation.runner import InstanceRecord, ObservationCache, observation_key


class LayerShares(BaseModel):
    """One attention layer over the test observations: mean shares of its N image masses.

    ``positional`` is the share of ``prior_peak``, the position the layer's static attention
    prior favours most, over the observations whose truth is elsewhere (None if there are
    none): the positional component that purification is there to remove. The purified shares
    are the layer's masses divided by its prior, renormalised (None without a prior).
    """

    layer: int = Field(description="model layer index")
    selected: float = Field(description="share of observations whose layers read include it")
    prior_peak: int | None = Field(description="0-based position of the prior's largest value")
    raw_truth: float
    raw_positional: float | None
    purified_truth: float | None = None
    purified_positional: float | None = None


class DivergenceProfile(BaseModel):
    """Rows: truth position; columns: position; entries: mean probability / attention share.
    ``layers``: one :class:`LayerShares` per attention layer (absent in older files)."""

    calibrator: str
    label_probabilities: list[list[float]]
    raw_attention: list[list[float]]
    purified_attention: list[list[float]] | None = None
    layers: list[LayerShares] | None = None


def _attention_calibrator(
    calibrators: Mapping[str, Calibrator], states: Mapping[str, CalibrationState]
) -> str | None:
    attention = [k for k, c in calibrators.items() if c.needs_attention]
    with_bias = [k for k in attention if states[k].bias_matrix is not None]
    with_prior = [k for k in attention if states[k].attention_prior is not None]
    chosen = with_bias or with_prior or attention
    return chosen[0] if chosen else None


def divergence_profiles(
    calibrators: Mapping[str, Calibrator],
    states: Mapping[str, CalibrationState],
    instances: Sequence[Instance],
    records: Sequence[InstanceRecord],
    cache: ObservationCache,
    seed: int,
) -> DivergenceProfile | None:
    """The divergence picture with the layer selection and prior of the first attention
    calibrator (attention_guided or purified_attention when present); None without attention."""
    label = _attention_calibrator(calibrators, states)
    if label is None:
        return None
    options = calibrators[label].options
    state = states[label]
    if isinstance(options, LayerSelectionOptions):
        # the calibrator's own reading and rows: the picture shows what its predictions read
        def read(observation: Observation) -> np.ndarray:
            return options.masses(observation, state)

        def rows(observation: Observation) -> np.ndarray:
            return options.rows_for(observation, state)

    else:
        selector = LayerSelector(
            top_k=getattr(options, "top_k", defaults.TOP_K),
            layer_range=getattr(options, "layer_range", None),
        )

        def read(observation: Observation) -> np.ndarray:
            return observation.attention_matrix

        def rows(observation: Observation) -> np.ndarray:
            return selector.select(observation.attention_matrix, observation.layers)

    corrector = Corrector(
        tau=getattr(options, "tau", defaults.TAU),
        layer_average=getattr(options, "layer_average", "arithmetic"),
    )
    prior = states[label].attention_prior_array
    by_id = {instance.id: instance for instance in instances}
    n = instances[0].n
    sums = {name: np.zeros((n, n)) for name in ("probs", "raw", "purified")}
    counts = np.zeros(n)
    per_layer = _LayerTally(prior)
    for record in records:
        base = by_id[record.instance_id]
        for order in record.orders:
            observation = cache.get(observation_key(base.permuted(order)))
            if observation is None or observation.attention is None or observation.target is None:
                continue
            masses = read(observation)
            layers = rows(observation)
            per_layer.add(masses, observation.target, layers, observation.layers)
            raw = mean_attention(masses, layers)
            target = observation.target
            counts[target] += 1
            sums["probs"][target] += np.exp(observation.label_logprobs)
            sums["raw"][target] += raw / max(raw.sum(), EPSILON)
            if prior is not None:
                purified = corrector.purified_log_attention(masses, prior, layers)
                sums["purified"][target] += corrector.visual_posterior(purified)
    if not counts.any():
        return None
    safe = np.maximum(counts, 1)[:, None]
    return DivergenceProfile(
        calibrator=label,
        label_probabilities=(sums["probs"] / safe).tolist(),
        raw_attention=(sums["raw"] / safe).tolist(),
        purified_attention=None if prior is None else (sums["purified"] / safe).tolist(),
        layers=per_layer.shares(),
    )


class _LayerTally:
    """Running sums of each layer's shares (see :class:`LayerShares`)."""

    def __init__(self, prior: np.ndarray | None) -> None:
        self.prior = prior
        self.peaks = None if prior is None else prior.argmax(axis=1)
        self.count = 0
        self.indices: tuple[int, ...] = ()
        self.sums: dict[str, np.ndarray] = {}
        self.positional_counts: np.ndarray | None = None

    def add(
        self, attention: np.ndarray, target: int, selected: np.ndarray, layers: LayerSet | None
    ) -> None:
        rows = attention.shape[0]
        if not self.sums:
            self.indices = tuple(layers.indices) if layers is not None else tuple(range(rows))
            self.sums = {name: np.zeros(rows) for name in _LAYER_SUMS}
            self.positional_counts = np.zeros(rows)
        self.count += 1
        self.sums["selected"][selected] += 1
        raw = attention / np.maximum(attention.sum(axis=1, keepdims=True), EPSILON)
        self.sums["raw_truth"] += raw[:, target]
        if self.prior is None or self.peaks is None or self.positional_counts is None:
            return
        purified = attention / np.maximum(self.prior, EPSILON)
        purified /= np.maximum(purified.sum(axis=1, keepdims=True), EPSILON)
        self.sums["purified_truth"] += purified[:, target]
        elsewhere = self.peaks != target
        self.positional_counts += elsewhere
        at_peak = np.arange(rows), self.peaks
        self.sums["raw_positional"] += np.where(elsewhere, raw[at_peak], 0.0)
        self.sums["purified_positional"] += np.where(elsewhere, purified[at_peak], 0.0)

    def shares(self) -> list[LayerShares] | None:
        if not self.count or self.positional_counts is None:
            return None
        mean = {name: total / self.count for name, total in self.sums.items()}
        counts = self.positional_counts
        with_prior = self.prior is not None and self.peaks is not None

        def positional(name: str, row: int) -> float | None:
            if not with_prior or not counts[row]:
                return None
            return float(self.sums[name][row] / counts[row])

        return [
            LayerShares(
                layer=layer,
                selected=float(mean["selected"][row]),
                prior_peak=int(self.peaks[row]) if self.peaks is not None else None,
                raw_truth=float(mean["raw_truth"][row]),
                raw_positional=positional("raw_positional", row),
                purified_truth=float(mean["purified_truth"][row]) if with_prior else None,
                purified_positional=positional("purified_positional", row),
            )
            for row, layer in enumerate(self.indices)
        ]


_LAYER_SUMS = (
    "selected",
    "raw_truth",
    "raw_positional",
    "purified_truth",
    "purified_positional",
)
