"""permutation_average: average each image's score over several candidate orders.

Every image visits several positions, so a purely positional bias averages out; this is the
costly upper baseline the single-pass methods are compared with. Two sets of orders:

* ``cyclic`` (default; the paper's appendix): the N cyclic shifts, N forward passes;
* ``random``: ``count`` distinct random permutations, identity first; ``count`` defaults to
  min(16, N!). ``draw: shared`` draws them once with ``seed`` for every instance;
  ``draw: per_instance`` (the authors' code) draws them afresh for every shown candidate order
  of every instance, from ``seed``, the instance id and its images in that order (so they
  depend on neither the batch nor the shard).

Each order's label scores are mapped back to image identity and averaged (``average: log``
averages the log-probabilities, ``prob`` the probabilities).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

import posdebias.defaults as defaults
from posdebias._markers import register_hook
from posdebias.calibrators.base import CalibratorOptions, OrderedCalibrator
from posdebias.core.instance import Instance, random_orders, rotation_order
from posdebias.core.observation import Observation, Prediction, log_mean_exp, log_softmax
from posdebias.core.state import CalibrationState
from posdebias.errors import ConfigError, InputError

DEFAULT_RANDOM_COUNT = 16


class OrderOptions(CalibratorOptions):
    """Which candidate orders a calibrator that combines several orders observes."""

    permutations: Literal["cyclic", "random"] = Field(
        default="cyclic", description="the N cyclic shifts, or random distinct permutations"
    )
    count: int | None = Field(
        default=None,
        ge=1,
        le=defaults.MAX_ORDERS,
        description="orders (default: N cyclic, min(16, N!) random)",
    )
    seed: int = Field(
        default=0, ge=0, le=defaults.MAX_SEED, description="seed of the random permutations"
    )
    draw: Literal["shared", "per_instance"] = Field(
        default="shared",
        description="random permutations drawn once for every instance, or afresh per "
        "instance and order (the authors' code)",
    )


class PermutationAverageOptions(OrderOptions):
    average: Literal["log", "prob"] = Field(
        default="log", description="average log-scores (log) or probabilities (prob) over orders"
    )


def instance_seed(seed: int, instance: Instance) -> int:
    """The seed of one instance's own permutations (``draw: per_instance``)."""
    key = "\x1f".join([str(seed), instance.id, *instance.candidate_ids])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def random_permutations(n: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` distinct permutations of N, the identity first, drawn with ``seed``."""
    if count > math.factorial(n):
        raise ConfigError(
            f"permutation_average: count {count} exceeds the N! = "
            f"{math.factorial(n)} distinct orders of N={n} candidates"
        )
    return random_orders(n, count, seed, identity_first=True)


class OrderCombiner(OrderedCalibrator):
    """Base of the calibrators that combine the observations of several candidate orders of
    an instance (one forward pass each): which orders (:class:`OrderOptions`) and the label
    scores of each, by candidate."""

    options: OrderOptions
    needs_rotations = True

    def permutations(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        count = self.options.count
        if self.options.permutations == "random":
            return random_permutations(
                n,
                count or min(DEFAULT_RANDOM_COUNT, math.factorial(n)),
                self.options.seed if seed is None else seed,
            )
        if count is not None and count > n:
            raise ConfigError(
                f"{self.name}: count {count} exceeds the N={n} cyclic shifts; use "
                "permutations: random for more orders"
            )
        return [rotation_order(n, shift) for shift in range(count or n)]

    def permutations_for(self, instance: Instance) -> list[np.ndarray]:
        if self.options.permutations == "random" and self.options.draw == "per_instance":
            return self.permutations(instance.n, instance_seed(self.options.seed, instance))
        return self.permutations(instance.n)

    def _predict_in_orders(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
        orders: Sequence[np.ndarray] | None,
    ) -> Prediction:
        """:meth:`_combine` of the [orders, N] label scores of every observed order, by the
        view's candidate position (candidate k sits at argsort(order)[k] of the order)."""
        if orders is None:
            if self.options.permutations == "random" and self.options.draw == "per_instance":
                raise InputError(
                    f"{self.name} with draw: per_instance needs the orders of the instance "
                    "(predict(..., orders=calibrator.permutations_for(instance)))"
                )
            orders = self.permutations(observation.n)
        assert rotations is not None  # predict() checks there is one observation per order
        return self._combine(scores_by_candidate(rotations, orders))

    def _combine(self, per_order: np.ndarray) -> Prediction:
        """The prediction from the [orders, N] scores by candidate (each subclass its own)."""
        raise NotImplementedError


class PermutationAverage(OrderCombiner):
    name = "permutation_average"
    Options = PermutationAverageOptions
    options: PermutationAverageOptions
    summary = "average label scores over several candidate orders (one forward pass each)"

    def _combine(self, per_order: np.ndarray) -> Prediction:
        return Prediction(scores=averaged_scores(per_order, self.options.average))


def scores_by_candidate(
    rotations: Sequence[Observation], orders: Sequence[np.ndarray]
) -> np.ndarray:
    """[orders, N] label scores of every observed order, mapped back to the view's positions
    (the view's candidate k sits at position argsort(order)[k] of the permuted order)."""
    return np.stack(
        [
            observed.label_logprobs[np.argsort(order)]
            for order, observed in zip(orders, rotations, strict=True)
        ]
    )


def averaged_scores(per_order: np.ndarray, average: Literal["log", "prob"] = "log") -> np.ndarray:
    """[orders, N] scores by candidate averaged (log-scores, or probabilities), renormalised:
    permutation averaging (also PriDe's permutation-based debiasing of its estimation items)."""
    averaged = per_order.mean(axis=0) if average == "log" else log_mean_exp(per_order, axis=0)
    return log_softmax(averaged)


posdebias_register_calibrators = register_hook(PermutationAverage)
