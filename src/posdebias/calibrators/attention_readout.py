"""attention_readout: choose the image the selected layers attend to most (no prior)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import LayerSelectionOptions
from posdebias.core.observation import Prediction
from posdebias.core.stages import EPSILON, mean_attention


class AttentionReadout(Calibrator):
    name = "attention_readout"
    Options = LayerSelectionOptions
    needs_attention = True
    summary = "argmax of the raw attention of the top-K layers"

    def _predict(self, observation, state, rotations) -> Prediction:
        layers = self.options.selector().select(observation.attention)
        readout = mean_attention(observation.attention, layers)
        return Prediction(scores=np.log(readout / max(readout.sum(), EPSILON) + EPSILON))


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(AttentionReadout)
