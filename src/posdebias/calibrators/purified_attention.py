"""purified_attention: the visual posterior pi alone (attention divided by its static prior)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import PosteriorOptions
from posdebias.core.observation import Evidence, Prediction, log_softmax
from posdebias.core.stages import PriorEstimator


class PurifiedAttention(Calibrator):
    name = "purified_attention"
    Options = PosteriorOptions
    needs_attention = True
    needs_fit = True
    needs_targets = False  # the static attention prior is a mean over all observations
    summary = "argmax of the attention posterior pi (static attention prior removed)"

    def _fit(self, observations):
        return {"attention_prior": PriorEstimator().attention_prior(observations).tolist()}

    def _predict(self, observation, state, rotations) -> Prediction:
        layers = self.options.selector().select(observation.attention)
        corrector = self.options.corrector()
        purified = corrector.purified_log_attention(
            observation.attention, state.attention_prior_array, layers
        )
        scores = log_softmax(corrector.tau * purified)
        return Prediction(
            scores=scores, evidence=Evidence(posterior=np.exp(scores), layers=tuple(layers))
        )


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(PurifiedAttention)
