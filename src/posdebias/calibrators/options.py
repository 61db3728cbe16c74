"""Option models shared by the attention-based calibrators."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

import posdebias.defaults as defaults
from posdebias.calibrators.base import CalibratorOptions
from posdebias.core.layers import GLOBAL, LAYER_KINDS, choose_layers, span_masses
from posdebias.core.observation import Observation
from posdebias.core.stages import Corrector, LayerSelector
from posdebias.core.state import CalibrationState
from posdebias.errors import InputError

#: A model layer index; negative counts from the end, as in Python.
LayerIndex = Annotated[int, Field(ge=-defaults.MAX_LAYERS, le=defaults.MAX_LAYERS)]


class LayerSelectionOptions(CalibratorOptions):
    layer_selection: Literal["evidence", "mass"] = Field(
        default="evidence",
        description="evidence: the K layers whose purified attention points at the truth most "
        "often on the calibration set (cross-validated; none when no layer beats chance); "
        "mass: per instance, the K layers with the most attention on the candidates (paper)",
    )
    span_mass: Literal["sum", "mean"] = Field(
        default=defaults.SPAN_MASS,
        description="a candidate's attention: summed over its tokens (paper) or their mean",
    )
    top_k: int = Field(
        default=defaults.TOP_K,
        ge=1,
        le=defaults.MAX_LAYERS,
        description="K layers read",
    )
    layer_range: tuple[LayerIndex, LayerIndex] | None = Field(
        default=None,
        strict=False,  # a pair is written as a list
        description="candidate model layers [start, stop) (default: all layers)",
    )
    layer_kinds: tuple[str, ...] | None = Field(
        default=None,
        strict=False,  # written as a list
        min_length=1,
        description="candidate layer kinds: global, sliding, chunked (default: every kind for "
        "evidence, a sliding or chunked layer only where it sees every candidate; global for "
        "mass)",
    )

    @field_validator("layer_kinds")
    @classmethod
    def _known_kinds(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
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

    def kinds(self) -> tuple[str, ...]:
        if self.layer_kinds is not None:
            return self.layer_kinds
        return LAYER_KINDS if self.layer_selection == "evidence" else (GLOBAL,)

    def selector(self) -> LayerSelector:
        return LayerSelector(
            top_k=self.top_k, layer_range=self.layer_range, layer_kinds=self.kinds()
        )

    def masses(self, observation: Observation) -> np.ndarray:
        """The observation's attention rows as ``span_mass`` reads them."""
        return span_masses(observation.attention_matrix, observation.span_lengths, self.span_mass)

    def fit_layers(self, observations: Sequence[Observation]) -> dict[str, Any]:
        """State fields of the layer choice (``layer_choice``, a warning when no layer is
        informative) for evidence selection; nothing for the paper's per-instance selection."""
        if self.layer_selection != "evidence":
            return {}
        layers = observations[0].layers
        assert layers is not None  # the caller checked that every observation has attention
        masses = np.stack([self.masses(obs) for obs in observations])
        # a window that leaves a candidate out in some view gives an exact zero: not a candidate
        candidates = np.array(
            [row for row in self.selector().candidates(layers) if np.all(masses[:, row] > 0)],
            dtype=int,
        )
        if candidates.size == 0:
            raise InputError(
                f"no attention layer of {layers.describe()} sees every candidate in every "
                "calibration view (a sliding window or chunk cuts some off); set layer_kinds "
                "to global or layer_selection to mass"
            )
        targets = np.array([obs.target for obs in observations])
        # each view against the prior of the others: the fit must not depend on the order
        # of its observations, so no grouping by position in the list
        choice = choose_layers(
            masses, targets, np.arange(len(observations)), candidates, self.top_k
        )
        fields: dict[str, Any] = {"layer_choice": choice.to_dict()}
        if not choice.informative:
            best = int(np.nanargmax(np.array(choice.accuracy)))
            fields["diagnostics"] = {
                "warning": "no attention layer points at the right candidate reliably more "
                f"often than chance on the calibration set (best: layer {layers.indices[best]}, "
                f"{100 * choice.accuracy[best]:.1f}% of {choice.views} views, chance "
                f"{100 / observations[0].n:.1f}%, p = {choice.p_value:.2g} after correcting for "
                f"{candidates.size} layers); the attention carries no usable evidence here "
                "(more calibration instances may find some)",
                "informative_layers": False,
            }
        return fields

    def static_prior(self, observations: Sequence[Observation]) -> np.ndarray:
        """The static attention prior of the masses as ``span_mass`` reads them: [L, N]."""
        return np.mean(np.stack([self.masses(obs) for obs in observations]), axis=0)

    def rows_for(self, observation: Observation, state: CalibrationState) -> np.ndarray:
        """The attention rows read for ``observation``: the state's chosen rows (those that see
        every candidate of this view), else the paper's per-instance choice by mass."""
        masses = self.masses(observation)
        choice = state.layer_choice if self.layer_selection == "evidence" else None
        if choice is not None:
            rows = np.array([row for row in choice.rows if np.all(masses[row] > 0)], dtype=int)
            if rows.size:
                return rows
        return self.selector().select(masses, observation.layers)


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
