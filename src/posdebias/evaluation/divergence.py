"""The logit-attention divergence picture: per truth position, where the label probabilities,
the raw attention and the purified attention point (mean over test observations)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel

import posdebias.defaults as defaults
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import RetrievalInstance
from posdebias.core.stages import EPSILON, Corrector, LayerSelector, mean_attention
from posdebias.core.state import CalibrationState
from posdebias.evaluation.runner import InstanceRecord, ObservationCache, observation_key


class DivergenceProfile(BaseModel):
    """Rows: truth position; columns: position; entries: mean probability / attention share."""

    calibrator: str
    label_probabilities: list[list[float]]
    raw_attention: list[list[float]]
    purified_attention: list[list[float]] | None = None


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
    instances: Sequence[RetrievalInstance],
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
    selector = (
        options.selector()
        if hasattr(options, "selector")
        else LayerSelector(
            top_k=getattr(options, "top_k", defaults.TOP_K),
            layer_range=getattr(options, "layer_range", None),
        )
    )
    corrector = Corrector(
        tau=getattr(options, "tau", defaults.TAU),
        layer_average=getattr(options, "layer_average", "arithmetic"),
    )
    prior = states[label].attention_prior_array
    by_id = {instance.id: instance for instance in instances}
    n = instances[0].n
    sums = {name: np.zeros((n, n)) for name in ("probs", "raw", "purified")}
    counts = np.zeros(n)
    for record in records:
        base = by_id[record.instance_id]
        for order in record.orders:
            observation = cache.get(observation_key(base.permuted(order)))
            if observation is None or observation.attention is None or observation.target is None:
                continue
            layers = selector.select(observation.attention, observation.layers)
            raw = mean_attention(observation.attention, layers)
            target = observation.target
            counts[target] += 1
            sums["probs"][target] += np.exp(observation.label_logprobs)
            sums["raw"][target] += raw / max(raw.sum(), EPSILON)
            if prior is not None:
                purified = corrector.purified_log_attention(observation.attention, prior, layers)
                sums["purified"][target] += corrector.visual_posterior(purified)
    if not counts.any():
        return None
    safe = np.maximum(counts, 1)[:, None]
    return DivergenceProfile(
        calibrator=label,
        label_probabilities=(sums["probs"] / safe).tolist(),
        raw_attention=(sums["raw"] / safe).tolist(),
        purified_attention=None if prior is None else (sums["purified"] / safe).tolist(),
    )
