"""purified_attention: the visual posterior pi alone (attention divided by its static prior)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import PosteriorOptions
from posdebias.core.observation import Evidence, Observation, Prediction, log_softmax
from posdebias.core.state import CalibrationState


class PurifiedAttention(Calibrator):
    name = "purified_attention"
    Options = PosteriorOptions
    options: PosteriorOptions
    needs_attention = True
    needs_fit = True
    summary = "argmax of the attention posterior pi (static attention prior removed)"

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        return ("attention_prior", *self.options.layer_reads())

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        return self.options.fit_attention(observations)

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        layers = self.options.rows_for(observation, state)
        corrector = self.options.corrector()
        purified = corrector.purified_log_attention(
            self.options.masses(observation, state), state.fitted("attention_prior"), layers
        )
        scores = log_softmax(corrector.tau * purified)
        return Prediction(
            scores=scores, evidence=Evidence(posterior=np.exp(scores), layers=tuple(layers))
        )


posdebias_register_calibrators = register_hook(PurifiedAttention)
