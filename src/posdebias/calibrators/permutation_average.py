"""permutation_average: average each image's score over the N cyclic rotations (N passes).

Every image visits every position once, so a purely positional bias averages out; this is the
costly upper baseline the single-pass methods are compared with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.core.observation import Prediction, log_softmax


class PermutationAverageOptions(CalibratorOptions):
    average: Literal["log", "prob"] = "log"


class PermutationAverage(Calibrator):
    name = "permutation_average"
    Options = PermutationAverageOptions
    needs_rotations = True
    summary = "average label scores over the N cyclic rotations (N forward passes)"

    def _predict(self, observation, state, rotations) -> Prediction:
        n = observation.n
        positions = np.arange(n)
        # the image at position k of this order sits at position (k - r) % N in rotation r
        per_rotation = np.stack(
            [rotations[r].label_logprobs[(positions - r) % n] for r in range(n)]
        )
        if self.options.average == "log":
            averaged = per_rotation.mean(axis=0)
        else:
            averaged = np.log(np.exp(per_rotation).mean(axis=0))
        return Prediction(scores=log_softmax(averaged))


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(PermutationAverage)
