"""attention_readout: choose the image the selected layers attend to most (no prior)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import LayerSelectionOptions
from posdebias.core.observation import Observation, Prediction
from posdebias.core.stages import EPSILON, mean_attention
from posdebias.core.state import CalibrationState


class AttentionReadout(Calibrator):
    name = "attention_readout"
    Options = LayerSelectionOptions
    options: LayerSelectionOptions
    needs_attention = True
    summary = "argmax of the raw attention of the top-K layers"

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        layers = self.options.selector().select(observation.attention_matrix, observation.layers)
        readout = mean_attention(observation.attention_matrix, layers)
        return Prediction(scores=np.log(readout / max(readout.sum(), EPSILON) + EPSILON))


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(AttentionReadout)
