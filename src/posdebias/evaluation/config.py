"""pydantic configuration of an evaluation run (a YAML/TOML file, overridden by CLI flags)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

import posdebias.defaults as defaults
from posdebias._inputs import (
    CONFIG_LIMIT,
    UsableName,
    UsablePath,
    load_yaml,
    parse_json,
    read_input_text,
)
from posdebias.core.tasks import default_orders
from posdebias.errors import ConfigError, UnknownNameError, options_error, validation_message
from posdebias.registry import get_registry

#: What a calibrator label may be: it becomes a file name (``<label>.json``).
SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
#: A label a new run may not take, though files written before may hold it: it would read as
#: the state of one of several N (``<label>.n<N>.json``).
_PER_N_LABEL = re.compile(r".*\.n[0-9]+\Z")
LABEL_RULE = (
    "use 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit, not ending "
    "in '.' or in '.n' and a number (the name of a state per N)"
)


def label_problem(value: object) -> str | None:
    """Why ``value`` cannot be a calibrator label (:data:`LABEL_RULE`), or None."""
    if isinstance(value, str) and _safe_file_label(value) and not _PER_N_LABEL.fullmatch(value):
        return None
    return LABEL_RULE


def _safe_file_label(value: str) -> bool:
    return SAFE_LABEL.fullmatch(value) is not None and not value.endswith(".")


def check_new_labels(config: EvaluateConfig, source: str = "configuration") -> EvaluateConfig:
    """``config`` if a new run can name its states by its calibrators' labels
    (:func:`label_problem`); the config model itself reads the labels of earlier files."""
    for spec in config.calibrators:
        problem = None if spec.label is None else label_problem(spec.label)
        if problem is not None:
            raise ConfigError(f"{source}: calibrators: label {spec.label!r}: {problem}")
    return config


DEFAULT_CALIBRATORS = defaults.CALIBRATORS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CalibratorSpec(_Strict):
    """One calibrator of a run; ``label`` names it in reports (default: its name)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @field_validator("label")
    @classmethod
    def _safe_label(cls, value: str | None) -> str | None:
        """A label names files (``states/<label>.json``): :data:`LABEL_RULE`."""
        if value is not None and not _safe_file_label(value):
            raise ValueError(f"a label names a file: {LABEL_RULE}")
        return value

    @property
    def key(self) -> str:
        return self.label or self.name


class AdapterSpec(_Strict):
    """The adapter by registry name; with ``model`` the name is optional (picked by
    model_type). With neither, the bundled organism model runs (``synthetic`` names the
    simulated model)."""

    name: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class EvaluateConfig(_Strict):
    """Everything that defines an evaluation run."""

    adapter: AdapterSpec = Field(default_factory=AdapterSpec)
    model: UsableName | None = Field(default=None, description="model id or path (HF adapters)")
    benchmark: UsablePath | None = Field(default=None, description="benchmark directory or JSONL")
    task: Literal["retrieval", "multiple_choice", "pairwise_judge", "rerank"] | None = Field(
        default=None,
        description="task kind of the benchmark (checked against its manifest; default: the "
        "benchmark's)",
    )
    calibration: UsablePath | None = Field(default=None, description="saved calibration state(s)")
    calibration_transfer: bool = Field(
        default=False,
        description="use saved calibration states fitted on another model (a transfer study); "
        "recorded in results.json",
    )
    calibration_benchmark: UsablePath | None = Field(
        default=None, description="separate benchmark to calibrate on (default: held out)"
    )
    calibrators: list[CalibratorSpec] = Field(
        default_factory=lambda: [CalibratorSpec(name=name) for name in DEFAULT_CALIBRATORS]
    )
    decoders: list[CalibratorSpec] = Field(
        default_factory=list,
        description="methods that run the model themselves (generated answers, SoFA); opt-in",
    )
    n: int = Field(
        default=defaults.CANDIDATES,
        ge=defaults.MIN_CANDIDATES,
        le=defaults.MAX_CANDIDATES,
        description="candidates per instance (no benchmark given)",
    )
    orders: int | None = Field(
        default=None,
        ge=1,
        le=defaults.MAX_ORDERS,
        description="candidate orders T per test instance (default: 5, or every order where "
        "fewer exist: both orders of a pair)",
    )
    order_kind: Literal["random", "cyclic"] = Field(
        default="random",
        description="random: T seeded distinct orders per instance; cyclic: the first T cyclic "
        "rotations of the file order (T <= N), as rotated harness tasks show them",
    )
    count: int = Field(default=200, ge=1, le=defaults.MAX_INSTANCES, description="test instances")
    calibration_count: int = Field(
        default=defaults.CALIBRATION_COUNT,
        ge=1,
        le=defaults.MAX_CALIBRATION,
        description=f"calibration instances M (default: {defaults.CALIBRATION_COUNT}; "
        f"{defaults.REFERENCE_CALIBRATION_COUNT} under protocol reference, the paper's)",
    )
    seed: int = Field(default=0, ge=0, le=defaults.MAX_SEED, description="random seed")
    protocol: Literal["default", "reference"] = Field(
        default="default",
        description="default, or reference: the authors' evaluation (see the method page)",
    )
    batch_size: int = Field(
        default=defaults.BATCH_SIZE, ge=1, le=defaults.MAX_BATCH_SIZE, description="forward batch"
    )
    resamples: int = Field(
        default=defaults.RESAMPLES,
        ge=defaults.MIN_RESAMPLES,
        le=defaults.MAX_RESAMPLES,
        description="bootstrap resamples of the test instances behind every 95% interval",
    )
    baseline: str | None = Field(
        default=None,
        description="a row every other row is also compared with (besides vanilla): paired "
        "bootstrap interval of the accuracy difference and exact McNemar test",
    )
    gpus_per_process: int | None = Field(
        default=None,
        ge=1,
        le=defaults.MAX_GPUS_PER_PROCESS,
        description="GPUs of each data-parallel process: its replica spreads over its own group "
        "(device_map over GPUs local_rank*G .. local_rank*G+G-1)",
    )
    out: UsablePath | None = None

    @model_validator(mode="after")
    def _protocol_calibration_count(self) -> EvaluateConfig:
        """``protocol: reference`` calibrates on the paper's M unless M is given."""
        if self.protocol == "reference" and "calibration_count" not in self.model_fields_set:
            self.calibration_count = defaults.REFERENCE_CALIBRATION_COUNT
            # still the protocol's default, not the user's: a config re-checked after its
            # protocol changed (checked_config) takes the new protocol's M
            self.model_fields_set.discard("calibration_count")
        return self

    @model_validator(mode="after")
    def _known_baseline(self) -> EvaluateConfig:
        """A chosen baseline must be one of the run's rows (a typo would silently compare
        nothing)."""
        rows = [spec.key for spec in [*self.calibrators, *self.decoders]]
        if self.baseline is not None and self.baseline not in rows:
            raise ValueError(
                f"baseline {self.baseline!r} is not a row of this run; choose one of {rows}"
            )
        return self

    @property
    def baselines(self) -> list[str]:
        """vanilla, then the chosen baseline: what every other row is compared with."""
        return list(dict.fromkeys(["vanilla", *([self.baseline] if self.baseline else [])]))

    @field_validator("calibrators", "decoders", mode="before")
    @classmethod
    def _normalise_calibrators(cls, value: Any) -> Any:
        """Accept names, a {name: options} mapping, or a list of {name, options, label}."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, dict):
            return [{"name": name, "options": options or {}} for name, options in value.items()]
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("decoders")
    @classmethod
    def _decoder_labels(cls, value: list[CalibratorSpec], info: Any) -> list[CalibratorSpec]:
        keys = [spec.key for spec in value]
        taken = {spec.key for spec in info.data.get("calibrators") or []}
        clashes = sorted({key for key in keys if keys.count(key) > 1 or key in taken})
        if clashes:
            raise ValueError(
                f"row labels must be unique across calibrators and decoders, repeated: {clashes} "
                "(give each a distinct 'label')"
            )
        return value

    @field_validator("calibrators")
    @classmethod
    def _unique_labels(cls, value: list[CalibratorSpec]) -> list[CalibratorSpec]:
        keys = [spec.key for spec in value]
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise ValueError(
                f"calibrator labels must be unique, repeated: {duplicates} "
                "(give each a distinct 'label')"
            )
        if not value:
            raise ValueError("at least one calibrator is needed")
        return value


def config_error(exc: ValidationError, source: str) -> ConfigError:
    """A ConfigError naming every wrong field, what was given and what is allowed."""
    return ConfigError(validation_message(exc, source, unknown="key"))


def checked_config(config: EvaluateConfig) -> EvaluateConfig:
    """``config`` validated again, as a config file is: a config changed after it was made (an
    assignment, ``model_copy(update=...)``) meets the same ranges and types as the command
    line, and a ConfigError names what is wrong."""
    try:
        # what was given, not the defaults it was filled with: a default that depends on
        # another field (M on the protocol) follows a change of that field
        checked = EvaluateConfig.model_validate(config.model_dump(exclude_unset=True))
    except ValidationError as exc:
        raise config_error(exc, "configuration") from None
    return check_new_labels(checked)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a YAML, TOML or JSON config file into a dict (no validation yet)."""
    source = Path(path)
    text = read_input_text(source, "config file", limit=CONFIG_LIMIT, error=ConfigError)
    if source.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise ConfigError(f"config file {source} cannot be parsed: {exc}") from None
    elif source.suffix == ".json":
        data = parse_json(text, f"config file {source}", error=ConfigError)
    else:
        data = load_yaml(text, f"config file {source}")
    if data is None:
        data = {}
    if _has_nul(data):
        raise ConfigError(f"config file {source} contains a NUL character; no setting can")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {source} must hold a mapping of settings")
    return data


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def load_config(path: str | Path | None = None, **overrides: Any) -> EvaluateConfig:
    """A validated config from an optional file plus overrides (None values are ignored)."""
    data = read_config_file(path) if path is not None else {}
    return config_from_data(data, str(path) if path else "configuration", **overrides)


def config_from_data(data: dict[str, Any], source: str, **overrides: Any) -> EvaluateConfig:
    """A validated config from parsed settings plus overrides (see :func:`load_config`)."""
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "adapter" and isinstance(value, dict):
            if value.get("name") is None:
                value = {**(data.get("adapter") or {}), "options": value.get("options", {})}
            data["adapter"] = value
        elif key == "adapter" and isinstance(value, str):
            current = data.get("adapter") or {}
            if not isinstance(current, dict) or current.get("name") not in (None, value):
                current = {"name": value}  # another adapter: the file's options do not apply
            data["adapter"] = {**current, "name": value}  # unnamed: its options are this one's
        else:
            data[key] = value
    try:
        config = EvaluateConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, source) from None
    _check_options(config, source)
    return check_new_labels(config, source)


def _check_options(config: EvaluateConfig, source: str) -> None:
    """Each calibrator's and decoder's options checked as the file is read, so that a wrong
    one is named with the file it is in (the run checks them again when it builds them; an
    unknown name is reported there)."""
    registry = get_registry()
    for kind, specs, get in (
        ("calibrator", config.calibrators, registry.calibrator_class),
        ("decoder", config.decoders, registry.decoder_class),
    ):
        for spec in specs:
            try:
                options: type[BaseModel] = get(spec.name).Options
            except UnknownNameError:
                continue
            try:
                options.model_validate(spec.options)
            except ValidationError as exc:
                owner = f"{source}: {kind} {spec.key!r}"
                raise options_error(exc, owner, options.model_fields) from None
            # an option given by its former name is recorded by its name
            spec.options = {current_option_name(options, key): v for key, v in spec.options.items()}


def current_option_name(options: type[BaseModel], key: str) -> str:
    """The option ``key`` names: itself, or the option it is a former name of."""
    for name, field in options.model_fields.items():
        former = field.validation_alias
        if isinstance(former, AliasChoices) and key != name and key in former.choices:
            return name
    return key


def orders_of(config: EvaluateConfig, n: int) -> int:
    """T of a run of N candidates: the config's ``orders``, or the default for N and the
    order kind (:func:`~posdebias.core.tasks.default_orders`; every door asks here)."""
    return default_orders(n, config.orders, cyclic=config.order_kind == "cyclic")
