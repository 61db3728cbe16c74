"""Option models shared by the attention-based calibrators."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

import posdebias.defaults as defaults
from posdebias.calibrators.base import CalibratorOptions
from posdebias.core.layers import GLOBAL, LAYER_KINDS
from posdebias.core.stages import Corrector, LayerSelector

#: A model layer index; negative counts from the end, as in Python.
LayerIndex = Annotated[int, Field(ge=-defaults.MAX_LAYERS, le=defaults.MAX_LAYERS)]


class LayerSelectionOptions(CalibratorOptions):
    top_k: int = Field(
        default=defaults.TOP_K,
        ge=1,
        le=defaults.MAX_LAYERS,
        description="K layers with the most image attention",
    )
    layer_range: tuple[LayerIndex, LayerIndex] | None = Field(
        default=None,
        strict=False,  # a pair is written as a list
        description="candidate model layers [start, stop) (default: all layers)",
    )
    layer_kinds: tuple[str, ...] = Field(
        default=(GLOBAL,),
        strict=False,  # written as a list
        min_length=1,
        description="candidate layer kinds: global, sliding, chunked (default: global only)",
    )

    @field_validator("layer_kinds")
    @classmethod
    def _known_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [kind for kind in value if kind not in LAYER_KINDS]
        if unknown:
            raise ValueError(f"unknown layer kind(s) {unknown}; known: {', '.join(LAYER_KINDS)}")
        return tuple(dict.fromkeys(value))

    @field_validator("layer_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and value[0] >= 0 and value[1] >= 0 and value[0] >= value[1]:
            raise ValueError(f"layer_range start {value[0]} must be below stop {value[1]}")
        return value

    def selector(self) -> LayerSelector:
        return LayerSelector(
            top_k=self.top_k, layer_range=self.layer_range, layer_kinds=self.layer_kinds
        )


class PosteriorOptions(LayerSelectionOptions):
    tau: float = Field(
        default=defaults.TAU,
        gt=0,
        le=defaults.MAX_TAU,
        description="temperature of the visual posterior",
    )
    layer_average: Literal["arithmetic", "geometric"] = Field(
        default="arithmetic",
        description="combine the top-K layers' posteriors: arithmetic (reference code) or "
        "geometric (paper Eq. 11)",
    )

    def corrector(self, mixture: Literal["log", "prob"] = "log") -> Corrector:
        return Corrector(tau=self.tau, layer_average=self.layer_average, mixture=mixture)
