"""The pipeline stages of ARCHITECTURE.md as pure numpy functions behind small typed classes.

Extraction is the adapter's job (it yields :class:`Observation`). The four stages here turn
observations into a calibration state (prior estimation, bias profile) and an observation plus a
state into corrected scores (layer selection, correction). Steps are numbered as in docs/method.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

import posdebias.defaults as defaults
from posdebias.core.layers import EPSILON, GLOBAL, LayerSet
from posdebias.core.observation import Observation, log_mean_exp, log_softmax, softmax
from posdebias.errors import InputError, ObservationError


def _require_targets(observations: Sequence[Observation]) -> None:
    if not observations:
        raise InputError("calibration needs at least one observation with a known target")
    missing = [i for i, obs in enumerate(observations) if obs.target is None]
    if missing:
        raise ObservationError(
            f"calibration observations {missing[:5]} have no target; calibration needs the truth"
        )
    sizes = {obs.n for obs in observations}
    if len(sizes) != 1:
        raise ObservationError(f"calibration observations mix N values {sorted(sizes)}")


def require_attention(observations: Sequence[Observation], who: str) -> None:
    """Raise a clear error if any observation lacks attention (the adapter cannot give it)."""
    if any(obs.attention is None for obs in observations):
        raise ObservationError(
            f"calibrator {who!r} needs attention, but the observations have none (the adapter "
            "cannot capture attention); use vanilla, pride or permutation_average instead"
        )
    layer_sets = {obs.layers for obs in observations}
    if len(layer_sets) != 1:
        described = sorted(layers.describe() for layers in layer_sets if layers is not None)
        raise ObservationError(
            f"observations mix attention layer sets ({'; '.join(described)}); observe them all "
            "with the same model"
        )


# -- layer selection -----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSelector:
    """Per-instance top-K layers by total attention mass on the images (Inference step 1).

    Candidates are the attention rows whose layer kind is in ``layer_kinds`` (default: global
    layers only, the layers that see every image; docs/method.md) and, with ``layer_range``,
    whose MODEL layer index lies in ``[start, stop)`` (Python slice semantics over the model's
    layers; negative values count from the top, the model's depth taken as the highest layer
    read + 1).
    """

    top_k: int = defaults.TOP_K
    layer_range: tuple[int, int] | None = None
    layer_kinds: tuple[str, ...] = (GLOBAL,)

    def candidates(self, layers: LayerSet | int) -> np.ndarray:
        """Row positions (into the attention array) of the candidate layers."""
        if isinstance(layers, int):
            layers = LayerSet.dense(layers)
        rows = np.array(layers.rows_of_kinds(self.layer_kinds), dtype=int)
        if rows.size == 0:
            present = sorted(set(layers.kinds))
            raise InputError(
                f"layer_kinds {list(self.layer_kinds)} selects no layer: this model's attention "
                f"rows are {layers.describe()}; set layer_kinds to some of {present}"
            )
        if self.layer_range is not None:
            depth = layers.indices[-1] + 1
            allowed = set(range(depth)[slice(*self.layer_range)])
            rows = np.array([row for row in rows if layers.indices[row] in allowed], dtype=int)
            if rows.size == 0:
                raise InputError(
                    f"layer_range {list(self.layer_range)} selects no candidate layer of "
                    f"{layers.describe()} with kinds {list(self.layer_kinds)}; give a range "
                    f"inside 0..{depth} that holds such a layer"
                )
        return rows

    def select(self, attention: np.ndarray, layers: LayerSet | None = None) -> np.ndarray:
        """Row positions of the K candidate layers with the largest S^(l) = sum_k a^(l)_k, in
        ascending order; ``layers`` names the rows (None: dense, rows = layers 0..L-1)."""
        candidates = self.candidates(attention.shape[0] if layers is None else layers)
        mass = attention[candidates].sum(axis=1)
        k = min(self.top_k, candidates.size)
        # stable sort on -mass: ties go to the lower layer, deterministically
        best = candidates[np.argsort(-mass, kind="stable")[:k]]
        return np.sort(best)


# -- prior estimation ------------------------------------------------------------------------


@dataclass(frozen=True)
class PriorEstimator:
    """Static priors over all M*N symmetrised observations (Calibration steps 4 and 5)."""

    def attention_prior(self, observations: Sequence[Observation]) -> np.ndarray:
        """a_prior^(l) = mean of a^(l)(x) over all observations: an [L, N] array."""
        return np.mean(np.stack([obs.attention_matrix for obs in observations]), axis=0)

    def logit_prior(self, observations: Sequence[Observation]) -> np.ndarray:
        """p_prior[j] = mean of s_j(x) over all observations (PriDe on the same budget)."""
        return np.mean(np.stack([obs.label_logprobs for obs in observations]), axis=0)


# -- bias profile ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BiasProfiler:
    """Conditional bias matrix B from observations with known truth (Calibration steps 1-3).

    ``average="log"`` (reference code, default) averages log-scores; ``"prob"`` (paper text)
    averages probabilities and takes the log.
    """

    average: Literal["log", "prob"] = "log"

    def observed_profile(self, observations: Sequence[Observation]) -> np.ndarray:
        """Lobs[i, j] = mean of s_j(x) over observations whose truth is at position i."""
        _require_targets(observations)
        n = observations[0].n
        scores = np.stack([obs.label_logprobs for obs in observations])
        targets = np.array([obs.target for obs in observations])
        profile = np.empty((n, n))
        for i in range(n):
            rows = scores[targets == i]
            if rows.shape[0] == 0:
                raise InputError(
                    f"no calibration observation has its truth at position {i + 1}; symmetrise "
                    "the calibration set (all cyclic rotations of each instance)"
                )
            profile[i] = rows.mean(axis=0) if self.average == "log" else log_mean_exp(rows, axis=0)
        return profile

    @staticmethod
    def visual_gain(profile: np.ndarray) -> float:
        """gamma = max over i and j != i of (Lobs[i, i] - Lobs[i, j])."""
        diagonal = np.diag(profile)[:, None]
        gaps = diagonal - profile
        np.fill_diagonal(gaps, -np.inf)
        return float(np.max(gaps))

    @staticmethod
    def bias_matrix(profile: np.ndarray, gamma: float) -> np.ndarray:
        """B[i, j] = Lobs[i, j] - gamma * [i == j]."""
        return profile - gamma * np.eye(profile.shape[0])

    def fit(self, observations: Sequence[Observation]) -> tuple[np.ndarray, float, np.ndarray]:
        """(Lobs, gamma, B) in one call."""
        profile = self.observed_profile(observations)
        gamma = self.visual_gain(profile)
        return profile, gamma, self.bias_matrix(profile, gamma)


# -- correction ------------------------------------------------------------------------------


def mean_attention(attention: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """mean over the selected layers of a^(l): the raw attention readout, an [N] vector."""
    return attention[layers].mean(axis=0)


@dataclass(frozen=True)
class Corrector:
    """Attention-guided correction of one observation (Inference steps 2-5).

    Options: ``tau`` (posterior temperature), ``layer_average`` (``arithmetic``: reference code,
    ``geometric``: paper Eq. 11) and ``mixture`` (``log``: b = pi @ B, reference code;
    ``prob``: b = log(pi @ rownorm(exp B)), paper).
    """

    tau: float = defaults.TAU
    layer_average: Literal["arithmetic", "geometric"] = "arithmetic"
    mixture: Literal["log", "prob"] = "log"

    def purified_log_attention(
        self, attention: np.ndarray, prior: np.ndarray, layers: np.ndarray
    ) -> np.ndarray:
        """log pi~_k: the attention of the selected layers divided by the static prior."""
        log_prior = np.log(prior[layers] + EPSILON)
        if self.layer_average == "arithmetic":
            return np.log(mean_attention(attention, layers) + EPSILON) - log_prior.mean(axis=0)
        return (np.log(attention[layers] + EPSILON) - log_prior).mean(axis=0)

    def visual_posterior(self, purified_log_attention: np.ndarray) -> np.ndarray:
        """pi = softmax(tau * log pi~)."""
        return softmax(self.tau * purified_log_attention)

    def expected_bias(self, posterior: np.ndarray, bias_matrix: np.ndarray) -> np.ndarray:
        """b_j(x): the bias expected given where the attention says the truth is."""
        if self.mixture == "log":
            return posterior @ bias_matrix
        conditional = softmax(bias_matrix)  # rows of exp(B), normalised
        return np.log(np.maximum(posterior @ conditional, EPSILON))

    @staticmethod
    def correct(label_logprobs: np.ndarray, expected_bias: np.ndarray) -> np.ndarray:
        """s^_j = s_j - b_j, renormalised to log-probabilities (argmax unchanged)."""
        return log_softmax(label_logprobs - expected_bias)
