"""What a calibrator fitted, saved as JSON with the metadata needed to refuse misuse."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import posdebias.defaults as defaults
from posdebias._inputs import STATE_LIMIT, json_failure, loads_json, read_input_text, usable_path
from posdebias._io import atomic_write_text
from posdebias.core.layers import LayerSet
from posdebias.errors import Advice, CalibrationError, ObservationError, validation_message

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
"""Version 1 states predate layer sets: their attention rows are layers 0..L-1 (dense)."""

Matrix = list[list[float]]
#: The largest magnitude of a fitted number (a log-probability, a gap between two, an attention
#: mass) a state may hold: far beyond any real fit (float32 log-probabilities stop near -1e4),
#: and small enough that the corrections' sums, products and exponentials stay finite.
MAX_FITTED = 1e5

#: The advice that ends a calibration error: the method to call in Python, the command to run
#: on the command line, the model argument of a harness (:meth:`PosdebiasError.message_for`).
RECALIBRATE = Advice(
    "Calibrate again for this model and setting (Debiaser.calibrate(instances)).",
    "Calibrate again for this model and setting (`posdebias calibrate`).",
    "Calibrate again for this model and setting (`posdebias calibrate`, or "
    "calibration=<a benchmark folder> in the model arguments).",
)
CREATE = Advice(
    "Debiaser.calibrate(instances) and Debiaser.save(path) write calibration states.",
    "`posdebias calibrate` writes calibration states.",
)
#: Said after RECALIBRATE when the state was fitted on another model.
TRANSFER = Advice(
    " To use a state fitted on another model on purpose (calibration transfer), pass "
    "transfer=True to Debiaser.load (or Debiaser.use_states).",
    " To use a state fitted on another model on purpose (calibration transfer), pass "
    "--calibration-transfer.",
    " To use a state fitted on another model on purpose (calibration transfer), pass "
    "calibration_transfer=True in the model arguments.",
)


#: The fitted fields of every calibration state (the built-in stages' results); a calibrator's
#: own fitted parameters go to ``extra`` instead.
STATE_FIELDS = frozenset(
    {
        "observed_profile",
        "bias_matrix",
        "gamma",
        "attention_prior",
        "logit_prior",
        "layer_choice",
        "diagnostics",
    }
)


def missing_reads(state: CalibrationState, reads: Sequence[str]) -> list[str]:
    """The names of ``reads`` that ``state`` holds no value for: a fitted field left empty, or
    an own parameter (a field of the calibrator's ``Fitted`` model) absent from ``extra``."""
    return [
        name
        for name in reads
        if (getattr(state, name) is None if name in STATE_FIELDS else name not in state.extra)
    ]


def calibration_error(message: str, advice: Advice) -> CalibrationError:
    """A :class:`CalibrationError` ending in library advice, with the other doors' attached."""
    return CalibrationError(f"{message}{advice.library}", advice=advice)


class LayerChoiceRecord(BaseModel):
    """The layers a calibrator chose from its calibration data (core/layers.py), as saved."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rows: list[Annotated[int, Field(ge=0, le=defaults.MAX_LAYERS)]] = Field(min_length=1)
    accuracy: list[Annotated[float, Field(ge=0, le=1)] | None]
    p_value: float = Field(ge=0, le=1)
    informative: bool
    views: int = Field(ge=1, le=10**12)
    span_mass: Literal["sum", "mean"] | None = Field(
        default=None,
        description="the reading of a candidate's attention the choice was made with (None in "
        "states saved before the reading was chosen: the calibrator's span_mass option)",
    )


class CalibrationState(BaseModel):
    """Everything a calibrator fitted plus where it came from.

    Arrays are stored as nested lists (JSON); use the ``*_array`` properties for numpy views.
    A calibrator that needs no fitting stores only metadata.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    calibrator: str
    options: dict[str, Any] = Field(default_factory=dict)
    n: int = Field(
        ge=defaults.MIN_CANDIDATES, le=defaults.MAX_CANDIDATES, description="number of candidates N"
    )
    num_layers: int | None = Field(
        default=None, ge=1, le=defaults.MAX_LAYERS, description="attention rows (layers read)"
    )
    layers: list[Annotated[int, Field(ge=0, le=defaults.MAX_LAYERS)]] | None = Field(
        default=None, description="model layer index of each attention row (None: 0..L-1)"
    )
    layer_kinds: list[str] | None = Field(
        default=None, description="kind of each attention row: global, sliding or chunked"
    )
    label_set: list[str] | None = None
    adapter: str | None = None
    model_id: str | None = None
    prompt_hash: str | None = None
    package_version: str = ""
    num_observations: int = Field(default=0, ge=0, le=10**12)
    calibration_ids: list[str] = Field(default_factory=list)
    observed_profile: Matrix | None = Field(default=None, description="Lobs [N, N]")
    bias_matrix: Matrix | None = Field(default=None, description="B [N, N]")
    gamma: float | None = None
    attention_prior: Matrix | None = Field(default=None, description="a_prior [L, N]")
    logit_prior: list[float] | None = Field(default=None, description="p_prior [N]")
    layer_choice: LayerChoiceRecord | None = Field(
        default=None, description="attention rows chosen from the calibration evidence"
    )
    diagnostics: dict[str, Any] = Field(
        default_factory=dict,
        description="what the fit found out about its data (e.g. uninformative attention)",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="a plugin calibrator's own fitted parameters (its ``Fitted`` model, as JSON)",
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> CalibrationState:
        n = self.n
        for name in ("observed_profile", "bias_matrix"):
            value = getattr(self, name)
            if value is not None and np.asarray(value).shape != (n, n):
                raise ValueError(f"{name} must be {n}x{n}, got shape {np.asarray(value).shape}")
        if self.layer_choice is not None:
            rows = self.num_layers or 0
            if len(self.layer_choice.accuracy) != rows or max(self.layer_choice.rows) >= rows:
                raise ValueError(
                    f"layer_choice must name rows of the {rows} attention rows read, with one "
                    "accuracy per row"
                )
        if self.logit_prior is not None and len(self.logit_prior) != n:
            raise ValueError(f"logit_prior must have {n} entries, got {len(self.logit_prior)}")
        if self.attention_prior is not None:
            shape = np.asarray(self.attention_prior).shape
            if len(shape) != 2 or shape[1] != n:
                raise ValueError(f"attention_prior must be [layers, {n}], got shape {shape}")
            if self.num_layers is not None and shape[0] != self.num_layers:
                raise ValueError(
                    f"attention_prior has {shape[0]} layers but num_layers is {self.num_layers}"
                )
        if self.layers is not None or self.layer_kinds is not None:
            if self.num_layers is None:
                raise ValueError("layers are given but num_layers is not")
            try:
                LayerSet.from_lists(self.layers, self.layer_kinds, self.num_layers)
            except ObservationError as exc:
                raise ValueError(str(exc)) from None
        if self.label_set is not None and len(self.label_set) != n:
            raise ValueError(f"label_set has {len(self.label_set)} labels for N={n}")
        self._check_fitted_values()
        prior = self.attention_prior
        if prior is not None and np.any(np.asarray(prior, dtype=float) < 0):
            raise ValueError(
                "attention_prior holds negative values; it is a mean of attention masses, "
                "which are never negative"
            )
        return self

    def _check_fitted_values(self) -> None:
        """Every fitted number is finite and within +-:data:`MAX_FITTED`."""
        for name in ("observed_profile", "bias_matrix", "attention_prior", "logit_prior", "gamma"):
            value = getattr(self, name)
            if value is None:
                continue
            array = np.asarray(value, dtype=float)
            if not np.all(np.isfinite(array)):
                raise ValueError(f"{name} contains NaN or infinite values")
            if np.any(np.abs(array) > MAX_FITTED):
                raise ValueError(
                    f"{name} holds {float(array.flat[np.argmax(np.abs(array))]):g}, beyond "
                    f"+-{MAX_FITTED:g}; fitted log-probabilities and attention masses are never "
                    "that large, and the correction's arithmetic would not stay finite"
                )

    @staticmethod
    def _array(value: Any) -> np.ndarray | None:
        return None if value is None else np.asarray(value, dtype=np.float64)

    @property
    def bias_matrix_array(self) -> np.ndarray | None:
        return self._array(self.bias_matrix)

    @property
    def attention_prior_array(self) -> np.ndarray | None:
        return self._array(self.attention_prior)

    @property
    def layer_set(self) -> LayerSet | None:
        """The model layers of the attention rows (dense 0..L-1 when the state names none)."""
        if self.num_layers is None:
            return None
        return LayerSet.from_lists(self.layers, self.layer_kinds, self.num_layers)

    def fitted(self, name: str) -> np.ndarray:
        """The fitted array ``name`` as float64; a CalibrationError when this state lacks it."""
        value = getattr(self, name, None)
        if value is None:
            raise calibration_error(
                f"the calibration state of {self.calibrator!r} has no {name!r}; ", CREATE
            )
        return np.asarray(value, dtype=np.float64)

    def with_metadata(self, **metadata: Any) -> CalibrationState:
        """A copy with metadata fields (adapter, model_id, label_set, ...) filled in."""
        return self.model_validate({**self.model_dump(), **metadata})

    # -- persistence -----------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the state as JSON atomically (temporary file, then rename)."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> CalibrationState:
        """Read and validate a saved state; every failure is a :class:`CalibrationError`."""
        source = usable_path(path, "calibration file")
        if not source.exists():
            raise calibration_error(f"calibration file {source} does not exist; ", CREATE)
        try:
            text = read_input_text(
                source, "calibration file", limit=STATE_LIMIT, error=CalibrationError
            )
        except CalibrationError as exc:
            raise calibration_error(f"{exc}; ", CREATE) from None
        try:
            payload = loads_json(text)
        except (ValueError, RecursionError) as exc:
            raise calibration_error(
                f"calibration file {source} is not valid JSON ({json_failure(exc)}); ", CREATE
            ) from None
        return cls.from_payload(payload, source=str(source))

    @classmethod
    def from_payload(cls, payload: Any, *, source: str = "<calibration>") -> CalibrationState:
        if not isinstance(payload, dict):
            raise CalibrationError(
                f"{source}: expected a JSON object, got {type(payload).__name__}"
            )
        version = payload.get("schema_version")
        if type(version) is not int or version not in READABLE_SCHEMA_VERSIONS:  # 2.0, True
            readable = ", ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)
            raise calibration_error(
                f"{source}: calibration schema version {version!r} is not supported (this "
                f"posdebias reads versions {readable}); ",
                CREATE,
            )
        if version == 1 and ("layers" in payload or "layer_kinds" in payload):
            raise calibration_error(
                f"{source}: a version 1 calibration state cannot name attention layers; ", CREATE
            )
        try:
            return cls.model_validate({**payload, "schema_version": SCHEMA_VERSION}, strict=True)
        except ValidationError as exc:
            raise CalibrationError(
                validation_message(exc, f"{source}: invalid calibration state", unknown="field")
            ) from exc

    # -- compatibility ---------------------------------------------------------------------

    def check_compatible(
        self, use: StateUse | None = None, /, *, source: str | None = None, **fields: Any
    ) -> None:
        """Refuse to use this state where it was not made for (each mismatch named).

        ``use`` says where it is about to be used (:class:`StateUse`); the same fields may be
        given as keywords instead (``state.check_compatible(n=4, calibrator="pride")``).
        ``source`` names the state in the message (its file or label).
        """
        use = use if use is not None else StateUse(**fields)
        problems = use.problems(self)
        if not problems:
            return
        advice = RECALIBRATE
        if use.transfers_model(self):
            advice = advice.then(TRANSFER)
        raise calibration_error(
            f"calibration state{f' {source}' if source else ''} does not fit this use: "
            + "; ".join(problems)
            + ". ",
            advice,
        )


#: How a state that records another value of a field than its use is refused ({theirs}: the
#: state's, {mine}: the use's).
_MISMATCHES = {
    "calibrator": "it was fitted by calibrator {theirs!r}, not {mine!r}",
    "n": "it was made for N={theirs} candidates, not N={mine}",
    "num_layers": "it has {theirs} layers but the model has {mine}",
    "label_set": "its labels are {theirs}, not {mine}",
    "adapter": "it was made with adapter {theirs!r}, not {mine!r}",
    "prompt_hash": "it was fitted with another prompt (task template, chat template or prompt "
    "options such as answer_prefix; hash {theirs!r}, now {mine!r})",
    "model_id": "it was fitted on model {theirs!r}, not {mine!r}",
}


@dataclass(frozen=True)
class StateUse:
    """Where a saved calibration state is about to be used: the one value a state is checked
    against (:meth:`CalibrationState.check_compatible`). A field left None is not checked,
    nor is a value the state does not record, except what the calibrator reads: ``reads``
    names it (fitted fields and own parameters), ``own_parameters`` is the model the state's
    ``extra`` must validate against, and a state lacking either is refused here rather than
    at its first prediction.

    ``layers``: the layer set of the observations (or the adapter's); a state whose attention
    rows come from other model layers, or layers of another kind, is refused. ``options`` are
    the using calibrator's options, ``prompt_hash`` and ``model_id`` the adapter's.
    """

    calibrator: str | None = None
    n: int | None = None
    num_layers: int | None = None
    layers: LayerSet | None = None
    label_set: list[str] | None = None
    adapter: str | None = None
    options: dict[str, Any] | None = None
    prompt_hash: str | None = None
    #: hashes the same prompt had in older versions (a retrieval prompt's older form)
    former_prompt_hashes: tuple[str, ...] = ()
    model_id: str | None = None
    reads: tuple[str, ...] = ()
    own_parameters: type[BaseModel] | None = None

    def problems(self, state: CalibrationState) -> list[str]:
        """Every way ``state`` does not fit this use, in words."""
        found = (
            self._differs("calibrator", state),
            self._differs("n", state),
            self._differs("num_layers", state),
            self._layers(state),
            self._differs("label_set", state),
            self._differs("adapter", state),
            self._options(state),
            self._differs("prompt_hash", state, *self.former_prompt_hashes),
            self._differs("model_id", state),
            self._reads(state),
        )
        return [problem for problem in found if problem]

    def transfers_model(self, state: CalibrationState) -> bool:
        """Whether the state was fitted on another model than this use's."""
        return self._differs("model_id", state) is not None

    def _differs(self, name: str, state: CalibrationState, *also: Any) -> str | None:
        """:data:`_MISMATCHES`'s words where the state records another ``name`` than this use
        (and than the values ``also`` accepted)."""
        mine, theirs = getattr(self, name), getattr(state, name)
        if mine is None or theirs in (None, mine, *also):
            return None
        return _MISMATCHES[name].format(mine=mine, theirs=theirs)

    def _layers(self, state: CalibrationState) -> str | None:
        own, prior = state.layer_set, state.attention_prior
        rows = None if own is not None or prior is None else len(prior)  # no layers recorded
        if self.layers is not None and rows is not None and rows != len(self.layers):
            return (
                f"its attention prior has {rows} rows, but this model's observations read "
                f"{len(self.layers)} ({self.layers.describe()})"
            )
        if self.layers is None or own is None or self.layers == own:
            return None
        return (
            f"its attention rows come from {own.describe()}, but this model's observations "
            f"read {self.layers.describe()}"
        )

    def _options(self, state: CalibrationState) -> str | None:
        mine, theirs = self.options, state.options
        if mine is None or mine == theirs:
            return None
        changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in changed)
        return f"it was fitted with other options ({shown})"

    def _reads(self, state: CalibrationState) -> str | None:
        if self.calibrator not in (None, state.calibrator):
            return None  # another calibrator's state: refused as such, its fields are its own
        found = []
        missing = missing_reads(state, self.reads)
        if missing:
            found.append(
                f"it holds no fitted {', '.join(map(repr, missing))}, which calibrator "
                f"{state.calibrator!r} reads (an edited or incomplete file)"
            )
        own = self.own_parameters
        unknown = sorted(set(state.extra) - set(own.model_fields)) if own is not None else []
        if unknown:
            found.append(f"its own fitted parameters (extra) hold unknown {unknown}")
        try:
            if own is not None:
                # the known keys: an unknown one is named once, above
                own.model_validate({k: v for k, v in state.extra.items() if k not in unknown})
        except ValidationError as exc:
            found.append(
                "its own fitted parameters " + validation_message(exc, "(extra)", unknown="field")
            )
        return "; ".join(found) or None
