"""Option models shared by the attention-based calibrators."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

import posdebias.defaults as defaults
from posdebias.calibrators.base import CalibratorOptions
from posdebias.core.layers import (
    GLOBAL,
    LAYER_KINDS,
    SPAN_READINGS,
    LayerChoice,
    choose_layers,
    span_masses,
)
from posdebias.core.observation import Observation
from posdebias.core.stages import Corrector, LayerSelector
from posdebias.core.state import CalibrationState
from posdebias.errors import CalibrationError, InputError

#: A model layer index; negative counts from the end, as in Python.
LayerIndex = Annotated[int, Field(ge=-defaults.MAX_LAYERS, le=defaults.MAX_LAYERS)]


def instance_groups(observations: Sequence[Observation]) -> np.ndarray:
    """[V] a number per instance shown (``instance_id``); an order whose instance is not known
    stands alone. Numbered by id, then by content read from its truth's position on (so that
    relabelling every position by one cyclic shift numbers them alike): the fit depends
    neither on the order of its observations nor on which position is called first."""

    def key(obs: Observation) -> tuple[int, str]:
        if obs.instance_id is not None:
            return 0, obs.instance_id
        if obs.target is not None:
            obs = obs.rotated(obs.target)
        content = hashlib.sha256(obs.label_logprobs.tobytes())
        content.update(obs.attention_matrix.tobytes())
        if obs.span_lengths is not None:
            content.update(obs.span_lengths.tobytes())
        content.update(str(obs.target).encode())
        return 1, content.hexdigest()

    keys = [key(obs) for obs in observations]
    number = {k: i for i, k in enumerate(sorted(set(keys)))}
    # identical orders of no known instance stand alone too (each is as good as the other)
    groups = np.array([number[k] for k in keys])
    alone = [v for v, k in enumerate(keys) if k[0] == 1]
    seen: set[int] = set()
    extra = len(number)
    for v in alone:
        if groups[v] in seen:
            groups[v] = extra
            extra += 1
        seen.add(int(groups[v]))
    return groups


def _span_lengths_known(observations: Sequence[Observation]) -> bool:
    """Whether the observations say their candidates' token counts: all (True) or none (False);
    a set where only some do is refused (one prior would mix per-token and summed masses)."""
    known = {obs.span_lengths is not None for obs in observations}
    if len(known) > 1:
        raise InputError(
            "some calibration observations give their candidates' span_lengths and others do "
            "not; a reading of the attention needs all or none (observe them with one adapter)"
        )
    return known == {True}


def read_masses(observations: Sequence[Observation], reading: str) -> np.ndarray:
    """Every observation's attention rows as ``reading`` reads them: [V, L, N]."""
    return np.stack(
        [span_masses(obs.attention_matrix, obs.span_lengths, reading) for obs in observations]
    )


class LayerSelectionOptions(CalibratorOptions):
    layer_selection: Literal["evidence", "mass"] = Field(
        default="evidence",
        description="evidence: the K layers whose purified attention points at the truth most "
        "often on the calibration set (cross-validated; none when no layer beats chance); "
        "mass: per instance, the K layers with the most attention on the candidates (paper)",
    )
    span_mass: Literal["evidence", "sum", "mean"] = Field(
        default=defaults.SPAN_MASS,
        description="a candidate's attention: summed over its tokens (paper), their mean, or "
        "evidence: whichever of the two lets the chosen layers point at the truth more often "
        "on the calibration set (the paper's sum under mass selection, which reads no evidence)",
    )
    top_k: int = Field(
        default=defaults.TOP_K,
        ge=1,
        le=defaults.MAX_LAYERS,
        description="K layers read at most (fewer where the model has fewer candidate layers "
        "or, under evidence selection, fewer beat chance)",
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

    def selector(self) -> LayerSelector:
        kinds = self.layer_kinds
        if kinds is None:
            kinds = LAYER_KINDS if self.layer_selection == "evidence" else (GLOBAL,)
        return LayerSelector(top_k=self.top_k, layer_range=self.layer_range, layer_kinds=kinds)

    def readings(self, observations: Sequence[Observation] | None = None) -> tuple[str, ...]:
        """The readings of a candidate's attention the fit may choose from; given the
        calibration ``observations``, only the sum where none says its candidates' lengths
        (both readings are then the sum)."""
        if self.span_mass != "evidence":
            return (self.span_mass,)
        if self.layer_selection != "evidence":
            return ("sum",)
        if observations is not None and not _span_lengths_known(observations):
            return ("sum",)
        return SPAN_READINGS

    def reading(self, state: CalibrationState | None = None) -> str:
        """The reading a fitted state uses: the one its layer choice was made with, else the
        option's own (the first it names). A state whose recorded reading contradicts the
        options, or that records none although the options leave it to the evidence, is
        refused (a saved state edited by hand, or fitted under other options)."""
        choice = state.layer_choice if state is not None else None
        recorded = choice.span_mass if choice is not None else None
        if choice is not None and self.layer_selection == "evidence":
            if recorded is None and self.span_mass == "evidence":
                raise CalibrationError(
                    "the calibration state's layer choice records no span_mass reading, but "
                    "the calibrator's span_mass is 'evidence'; calibrate again, or set "
                    "span_mass to the reading it was fitted with (mean or sum)"
                )
            if recorded is not None and self.span_mass not in ("evidence", recorded):
                raise CalibrationError(
                    f"the calibration state's layers were chosen reading span_mass "
                    f"{recorded!r}, but the calibrator's span_mass is {self.span_mass!r}; "
                    "calibrate again, or use the options it was fitted with"
                )
        if recorded is not None:
            return recorded
        return self.readings()[0]

    def masses(self, observation: Observation, state: CalibrationState | None = None) -> np.ndarray:
        """The observation's attention rows as the state (or, unfitted, the option) reads them."""
        return span_masses(
            observation.attention_matrix, observation.span_lengths, self.reading(state)
        )

    def fit_attention(
        self, observations: Sequence[Observation], *, prior: bool = True
    ) -> dict[str, Any]:
        """State fields of the attention fit: the layer choice (evidence selection; with a
        warning when no layer is informative) and, with ``prior``, the static attention prior
        [L, N] under the reading the choice was made with."""
        fields: dict[str, Any] = {}
        reading = self.readings(observations)[0]
        if self.layer_selection == "evidence":
            choice = self._choose_layers(observations)
            reading = choice.span_mass
            fields["layer_choice"] = choice.to_dict()
            if not choice.informative:
                fields["diagnostics"] = self._uninformative(observations, choice)
        if prior:
            # summed in sorted order: the prior does not depend on the order of the observations
            masses = np.sort(read_masses(observations, reading), axis=0)
            fields["attention_prior"] = masses.mean(axis=0).tolist()
        return fields

    def _choose_layers(self, observations: Sequence[Observation]) -> LayerChoice:
        """The best layer choice over the readings tried (ties to the first reading)."""
        layers = observations[0].layers
        assert layers is not None  # the caller checked that every observation has attention
        readings = self.readings(observations)
        # a window that leaves a candidate out in some view gives an exact zero: not a candidate
        raw = np.stack([obs.attention_matrix for obs in observations])
        candidates = np.array(
            [row for row in self.selector().candidates(layers) if np.all(raw[:, row] > 0)],
            dtype=int,
        )
        if candidates.size == 0:
            raise InputError(
                f"no attention layer of {layers.describe()} sees every candidate in every "
                "calibration view (a sliding window or chunk cuts some off); set layer_kinds "
                "to global or layer_selection to mass"
            )
        return choose_layers(
            {reading: read_masses(observations, reading) for reading in readings},
            np.array([obs.target for obs in observations]),
            instance_groups(observations),
            candidates,
            self.top_k,
        )

    def _uninformative(
        self, observations: Sequence[Observation], choice: LayerChoice
    ) -> dict[str, Any]:
        layers = observations[0].layers
        assert layers is not None
        best = int(np.nanargmax(np.array(choice.accuracy)))
        tried = len(self.readings(observations))
        corrected = f"{int(np.sum(~np.isnan(np.array(choice.accuracy))))} layers" + (
            f" and {tried} readings of a candidate's attention" if tried > 1 else ""
        )
        return {
            "warning": "no attention layer points at the right candidate reliably more often "
            f"than chance on the calibration set (best: layer {layers.indices[best]}, "
            f"{100 * choice.accuracy[best]:.1f}% of {choice.views} views, chance "
            f"{100 / observations[0].n:.1f}%, p = {choice.p_value:.2g} after correcting for "
            f"{corrected}); the attention carries no usable evidence here (more calibration "
            "instances may find some)",
            "informative_layers": False,
        }

    def layer_reads(self) -> tuple[str, ...]:
        """The state field a prediction reads its layers from (evidence selection's choice)."""
        return ("layer_choice",) if self.layer_selection == "evidence" else ()

    def rows_for(self, observation: Observation, state: CalibrationState) -> np.ndarray:
        """The attention rows read for ``observation``: the state's chosen rows (those that see
        every candidate of this view), else the paper's per-instance choice by mass."""
        masses = self.masses(observation, state)
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
