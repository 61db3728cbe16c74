"""The pipeline stages of ARCHITECTURE.md as pure numpy functions behind small typed classes.

Extraction is the adapter's job (it yields :class:`Observation`). The four stages here turn
observations into a calibration state (prior estimation, bias profile) and an observation plus a
state into corrected scores (layer selection, correction). Equation numbers refer to METHOD.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

import posdebias.defaults as defaults
from posdebias.core.observation import Observation, log_mean_exp, log_softmax, softmax
from posdebias.errors import InputError, ObservationError

EPSILON = 1e-20
"""Guard for every log of an attention mass or probability (METHOD.md, Inference step 2)."""


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
    layers = {obs.num_layers for obs in observations}
    if len(layers) != 1:
        raise ObservationError(f"observations mix layer counts {sorted(layers, key=str)}")


# -- layer selection -----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSelector:
    """Per-instance top-K layers by total attention mass on the images (Inference step 1).

    ``layer_range`` restricts the candidates to layers ``[start, stop)`` (Python slice
    semantics; negative values count from the top).
    """

    top_k: int = defaults.TOP_K
    layer_range: tuple[int, int] | None = None

    def candidates(self, num_layers: int) -> np.ndarray:
        layers = np.arange(num_layers)
        if self.layer_range is not None:
            layers = layers[slice(*self.layer_range)]
            if layers.size == 0:
                raise InputError(
                    f"layer_range {list(self.layer_range)} selects no layer of a {num_layers}-"
                    "layer model; give a range inside 0..{num_layers}"
                )
        return layers

    def select(self, attention: np.ndarray) -> np.ndarray:
        """Indices of the K layers with the largest S^(l) = sum_k a^(l)_k, ascending order."""
        candidates = self.candidates(attention.shape[0])
        mass = attention[candidates].sum(axis=1)
        k = min(self.top_k, candidates.size)
        # stable sort on -mass: ties go to the lower layer, deterministically
        best = candidates[np.argsort(-mass, kind="stable")[:k]]
        return np.sort(best)


# -- prior estimation ------------------------------------------------------------------------


def _attention(observation: Observation) -> np.ndarray:
    if observation.attention is None:  # callers check with require_attention first
        raise ObservationError("an observation has no attention")
    return observation.attention


@dataclass(frozen=True)
class PriorEstimator:
    """Static priors over all M*N symmetrised observations (Calibration steps 4 and 5)."""

    def attention_prior(self, observations: Sequence[Observation]) -> np.ndarray:
        """a_prior^(l) = mean of a^(l)(x) over all observations: an [L, N] array."""
        return np.mean(np.stack([_attention(obs) for obs in observations]), axis=0)

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
            if self.average == "log":
                profile[i] = rows.mean(axis=0)
            else:
                profile[i] = log_mean_exp(rows, axis=0)
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
