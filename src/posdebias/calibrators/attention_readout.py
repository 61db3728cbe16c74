"""attention_readout: choose the image the selected layers attend to most (no prior)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import LayerSelectionOptions
from posdebias.core.observation import Evidence, Observation, Prediction
from posdebias.core.stages import EPSILON, mean_attention
from posdebias.core.state import CalibrationState


class AttentionReadout(Calibrator):
    name = "attention_readout"
    Options = LayerSelectionOptions
    options: LayerSelectionOptions
    needs_attention = True
    needs_fit = True  # the layers are chosen on the calibration set (layer_selection)
    summary = "argmax of the raw attention of the chosen layers"

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        return self.options.layer_reads()

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        return self.options.fit_attention(observations, prior=False)

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        layers = self.options.rows_for(observation, state)
        readout = mean_attention(self.options.masses(observation, state), layers)
        return Prediction(
            scores=np.log(readout / max(readout.sum(), EPSILON) + EPSILON),
            evidence=Evidence(layers=tuple(layers)),
        )


posdebias_register_calibrators = register_hook(AttentionReadout)
