"""The calibrator interface: ``fit(observations) -> CalibrationState``, ``predict(obs, state)``.

Calibrators never call a model. A calibrator that needs the N cyclic rotations of an instance
(``needs_rotations``) receives their observations from the runner through ``rotations``, in
the order of :meth:`Calibrator.permutations` (default: the N cyclic rotations).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from posdebias._version import __version__
from posdebias.core.instance import Instance, rotation_order
from posdebias.core.observation import Evidence, Observation, Prediction
from posdebias.core.stages import LayerSelector, mean_attention, require_attention
from posdebias.core.state import (
    CREATE,
    STATE_FIELDS,
    CalibrationState,
    calibration_error,
    missing_reads,
)
from posdebias.errors import (
    InputError,
    ObservationError,
    PluginContractError,
    options_error,
    validation_message,
)


class CalibratorOptions(BaseModel):
    """Base of every calibrator's options model: unknown options are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Calibrator(ABC):
    """Base class of calibrators; plugins subclass it and register the class.

    Class attributes:
        name: the registry name (``get_calibrator(name)``).
        Options: a :class:`CalibratorOptions` subclass; its fields are the options.
        needs_attention: predict/fit need ``Observation.attention``.
        needs_fit: fit uses the calibration observations (False: trivial state, so the
            calibrator works without calibration data).
        needs_targets: fit needs to know where the truth is (False: it fits from unlabelled
            observations, and ``fit`` hides their targets from it).
        needs_rotations: predict needs the observations of other candidate orders of the
            instance (:meth:`permutations`; the N cyclic rotations unless overridden).
        Fitted: a pydantic model of the calibrator's own fitted parameters, for fields the
            calibration state does not have; ``_fit`` returns them (a dict or the model) and
            they are saved, validated, in ``CalibrationState.extra``; :meth:`fitted` reads them.
    """

    name: ClassVar[str]
    Options: ClassVar[type[CalibratorOptions]] = CalibratorOptions
    needs_attention: ClassVar[bool] = False
    needs_fit: ClassVar[bool] = False
    needs_targets: ClassVar[bool] = True
    needs_rotations: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    Fitted: ClassVar[type[BaseModel] | None] = None

    def __init__(self, **options: Any) -> None:
        try:
            self.options = self.Options(**options)
        except ValidationError as exc:
            raise options_error(
                exc, f"calibrator {self.name!r}", self.Options.model_fields
            ) from None

    def forward_passes(self, n: int) -> int:
        """Model forward passes per test instance and candidate order."""
        return len(self.permutations(n)) if self.needs_rotations else 1

    def passes_with(self, n: int, state: CalibrationState) -> float:
        """Mean forward passes per test instance and order under this fitted state (default
        :meth:`forward_passes`; PriDe's test workflow answers a share of the items from N)."""
        return self.forward_passes(n)

    def permutations(self, n: int) -> list[np.ndarray]:
        """The candidate orders whose observations ``predict`` receives as ``rotations``
        (``view.permuted(p)``: new position k shows the view's position p[k])."""
        return [rotation_order(n, shift) for shift in range(n)]

    def fit_views(
        self,
        calibration: Sequence[Instance],
        test: Sequence[Instance] | None = None,
    ) -> list[Instance] | None:
        """The instances whose observations :meth:`fit` receives, or None for the shared
        symmetrised calibration set (``calibration``: that set; ``test``: every view the run
        will score, every test instance in each of its T orders, where the caller knows them).
        Contextual calibration asks for content-free views, batch calibration for ``test``."""
        return None

    def permutations_for(self, instance: Instance) -> list[np.ndarray]:
        """The candidate orders of :meth:`permutations` for this instance (a calibrator that
        draws its orders per instance overrides this; default: the same for every instance)."""
        return self.permutations(instance.n)

    def orders_for(self, view: Instance, state: CalibrationState) -> list[np.ndarray] | None:
        """The candidate orders whose observations :meth:`predict` receives (as ``rotations``,
        with these ``orders``) for this shown view under this fitted state, or None for none.
        Default: :meth:`permutations_for` for a calibrator with ``needs_rotations``. A
        calibrator that answers only some instances from other orders (PriDe's estimation
        items) overrides this; the runner and ``Debiaser`` observe what it asks for."""
        return self.permutations_for(view) if self.needs_rotations else None

    def views_of(self, instance: Instance) -> list[Instance]:
        """The instance in every order of :meth:`permutations_for` (what the runner observes;
        pass the same orders to :meth:`predict` as ``orders``)."""
        return [instance.permuted(order) for order in self.permutations_for(instance)]

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        """What ``_predict`` reads from ``state`` under these options: fitted fields of the
        calibration state (``bias_matrix``, ``layer_choice``, ...) and fields of ``Fitted``.
        Every door refuses a saved state lacking one before a run starts; a fit that leaves
        one empty is a plugin contract error. Default: nothing."""
        return ()

    # -- fitting -----------------------------------------------------------------------------

    def fit(
        self, observations: Sequence[Observation], *, n: int | None = None, **metadata: Any
    ) -> CalibrationState:
        """Fit on calibration observations (with targets); ``metadata`` fills state fields.

        Calibrators with ``needs_fit = False`` accept an empty list if ``n`` is given.
        """
        observations = list(observations)
        if observations:
            n = observations[0].n
        if n is None:
            raise InputError(f"calibrator {self.name!r}: fit needs observations (or n=)")
        layer_fields: dict[str, Any] = {}
        if self.needs_attention and observations:
            require_attention(observations, self.name)
            layers = observations[0].layers
            assert layers is not None  # attention present (require_attention)
            layer_fields = {
                "num_layers": len(layers),
                "layers": list(layers.indices),
                "layer_kinds": list(layers.kinds),
            }
        if self.needs_fit and not observations:
            raise InputError(f"calibrator {self.name!r} needs calibration observations")
        if not self.needs_targets:  # a label-free fit cannot peek at the truth
            observations = [dataclasses.replace(obs, target=None) for obs in observations]
        fitted = self._split_fitted(self._fit(observations) if self.needs_fit else {})
        state = CalibrationState(
            calibrator=self.name,
            options=self.options.model_dump(mode="json"),
            n=n,
            **layer_fields,
            package_version=__version__,
            num_observations=len(observations),
            **fitted,
            **metadata,
        )
        self._check_reads(state)
        return state

    def _check_reads(self, state: CalibrationState) -> None:
        """:meth:`state_reads` names fields a fit of this calibrator filled."""
        reads = self.state_reads(state)
        own = set(self.Fitted.model_fields) if self.Fitted is not None else set()
        if not isinstance(reads, tuple) or not all(isinstance(name, str) for name in reads):
            raise PluginContractError(
                f"calibrator {self.name!r}: state_reads returned {reads!r}, not a tuple of names"
            )
        problem = ""
        if unknown := [name for name in reads if name not in STATE_FIELDS | own]:
            problem = (
                f"names {unknown}, neither fitted fields of the calibration state "
                f"({', '.join(sorted(STATE_FIELDS))}) nor fields of its Fitted model"
            )
        elif missing := missing_reads(state, reads):
            fitted = "its _fit did not fill them" if self.needs_fit else "needs_fit is False"
            problem = f"names {missing}, but {fitted}"
        if problem:
            raise PluginContractError(
                f"calibrator {self.name!r}: state_reads (what _predict reads) {problem}"
            )

    def _fit(self, observations: list[Observation]) -> dict[str, Any] | BaseModel:
        """Return the fitted state fields (arrays as nested lists) and, for a calibrator with a
        ``Fitted`` model, its own parameters (or return a ``Fitted`` instance)."""
        return {}

    def _split_fitted(self, fitted: dict[str, Any] | BaseModel) -> dict[str, Any]:
        """State fields from what ``_fit`` returned: known fields as they are, the calibrator's
        own parameters validated by its ``Fitted`` model into ``extra``."""
        if isinstance(fitted, BaseModel):
            fitted = fitted.model_dump(mode="json")
        if not isinstance(fitted, dict):
            raise PluginContractError(
                f"calibrator {self.name!r}: _fit returned {type(fitted).__name__}, not a dict"
            )
        known = {key: value for key, value in fitted.items() if key in STATE_FIELDS}
        own = {key: value for key, value in fitted.items() if key not in STATE_FIELDS}
        if not own:
            return known
        if self.Fitted is None:
            raise PluginContractError(
                f"calibrator {self.name!r}: _fit returned fields the calibration state does not "
                f"have ({', '.join(sorted(own))}); declare them in a pydantic model `Fitted` "
                "on the calibrator class"
            )
        try:
            validated = self.Fitted.model_validate(own)
        except ValidationError as exc:
            raise PluginContractError(
                validation_message(exc, f"calibrator {self.name!r}: _fit", unknown="field")
            ) from None
        return {**known, "extra": validated.model_dump(mode="json")}

    def fitted(self, state: CalibrationState) -> Any:
        """This calibrator's own fitted parameters from ``state`` (an instance of ``Fitted``)."""
        if self.Fitted is None:
            raise PluginContractError(f"calibrator {self.name!r} declares no `Fitted` model")
        try:
            return self.Fitted.model_validate(state.extra)
        except ValidationError as exc:
            said = validation_message(
                exc, f"calibration state of {self.name!r}: extra", unknown="field"
            )
            raise calibration_error(f"{said}; ", CREATE) from None

    # -- prediction --------------------------------------------------------------------------

    def predict(
        self,
        observation: Observation,
        state: CalibrationState,
        *,
        rotations: Sequence[Observation] | None = None,
        orders: Sequence[np.ndarray] | None = None,
        explain: bool = False,
    ) -> Prediction:
        """Calibrated scores for ``observation`` (positions in the observation's own order).

        ``rotations``: for a calibrator with ``needs_rotations``, the observations of its
        candidate orders of the instance, and ``orders`` those orders
        (:meth:`permutations_for` of the instance; default :meth:`permutations`).

        ``explain=True`` attaches :class:`Evidence`: the model's own label probabilities, the
        attention readout (where the observation has attention) and whatever the calibrator
        used on top (posterior, expected bias).
        """
        state.check_compatible(calibrator=self.name, n=observation.n)
        if self.needs_attention:
            require_attention([observation], self.name)
            state.check_compatible(layers=observation.layers)
        wanted = len(self.permutations(observation.n)) if self.needs_rotations else 0
        if self.needs_rotations and (rotations is None or len(rotations) != wanted):
            got = "none" if rotations is None else len(rotations)
            raise ObservationError(
                f"calibrator {self.name!r} needs the observations of its {wanted} candidate "
                f"orders (permutations), got {got}"
            )
        if self.needs_rotations and orders is not None and len(orders) != wanted:
            raise ObservationError(
                f"calibrator {self.name!r}: {len(orders)} orders for {wanted} observations"
            )
        try:
            prediction = self._predict_in_orders(observation, state, rotations, orders)
        except ObservationError as exc:  # Prediction() refused what _predict made
            raise PluginContractError(
                f"calibrator {self.name!r} returned invalid scores: {exc}"
            ) from None
        prediction = self._checked(prediction, observation.n)
        if not explain and prediction.evidence is None:
            return prediction
        evidence = None  # unasked for: the calibrator's own is dropped
        if explain:
            own = prediction.evidence or Evidence()
            evidence = own.merged(self._generic_evidence(observation))
        return Prediction(
            scores=prediction.scores,
            choice=-1 if prediction.by_scores else prediction.choice,
            evidence=evidence,
        )

    def _checked(self, prediction: object, n: int) -> Prediction:
        """A prediction that holds N finite scores, or a PluginContractError naming us."""
        if not isinstance(prediction, Prediction):
            raise PluginContractError(
                f"calibrator {self.name!r}: _predict returned {type(prediction).__name__}, not "
                "a posdebias Prediction"
            )
        if prediction.scores.shape != (n,):
            raise PluginContractError(
                f"calibrator {self.name!r} returned {prediction.scores.shape[0]} scores for "
                f"N={n} candidates; _predict must return one finite score per candidate"
            )
        return prediction

    def _generic_evidence(self, observation: Observation) -> Evidence:
        """What any calibrator can show: label probabilities and the attention readout."""
        readout = layers = None
        if observation.attention is not None:
            make_selector = getattr(self.options, "selector", None)
            selector = make_selector() if callable(make_selector) else LayerSelector()
            chosen = selector.select(observation.attention, observation.layers)
            mean = mean_attention(observation.attention, chosen)
            readout = mean / mean.sum() if mean.sum() > 0 else mean
            layers = tuple(chosen.tolist())
        return Evidence(
            label_probabilities=np.exp(observation.label_logprobs),
            attention_readout=readout,
            layers=layers,
        )

    def _predict_in_orders(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
        orders: Sequence[np.ndarray] | None,
    ) -> Prediction:
        """:meth:`_predict`, for a calibrator whose rotations come in per-instance ``orders``
        (override this instead; default: the orders are :meth:`permutations`)."""
        return self._predict(observation, state, rotations)

    @abstractmethod
    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"


class OrderedCalibrator(Calibrator):
    """Base of the calibrators whose prediction is defined on per-instance candidate orders:
    they implement :meth:`_predict_in_orders`, and a prediction without given orders reads
    the rotations in their default orders (:meth:`permutations`)."""

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        return self._predict_in_orders(observation, state, rotations, None)

    @abstractmethod
    def _predict_in_orders(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
        orders: Sequence[np.ndarray] | None,
    ) -> Prediction: ...
