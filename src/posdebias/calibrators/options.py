"""Option models shared by the attention-based calibrators."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

import posdebias.defaults as defaults
from posdebias.calibrators.base import CalibratorOptions
from posdebias.core.stages import Corrector, LayerSelector


class LayerSelectionOptions(CalibratorOptions):
    top_k: int = Field(
        default=defaults.TOP_K, ge=1, description="K layers with the most image attention"
    )
    layer_range: tuple[int, int] | None = Field(
        default=None, description="candidate layers [start, stop) (default: all layers)"
    )

    @field_validator("layer_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and value[0] >= 0 and value[1] >= 0 and value[0] >= value[1]:
            raise ValueError(f"layer_range start {value[0]} must be below stop {value[1]}")
        return value

    def selector(self) -> LayerSelector:
        return LayerSelector(top_k=self.top_k, layer_range=self.layer_range)


class PosteriorOptions(LayerSelectionOptions):
    tau: float = Field(
        default=defaults.TAU, gt=0, description="temperature of the visual posterior"
    )
    layer_average: Literal["arithmetic", "geometric"] = "arithmetic"

    def corrector(self, mixture: Literal["log", "prob"] = "log") -> Corrector:
        return Corrector(tau=self.tau, layer_average=self.layer_average, mixture=mixture)
