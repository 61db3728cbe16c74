"""The typed schema of a results file (``results.json``), version 2, and the reader of version 1.

Every section is a pydantic model with documented fields. Two sections also keep keys they do
not declare (``extra="allow"``): ``adapter`` (an adapter plugin's ``describe()`` may add its own)
and ``timing`` (measurements vary with the hardware). Version 1 files (written before the
statistics section existed) are read as version 2 with ``statistics`` absent, so old run
directories still report; their tables show no intervals.
"""

from __future__ import annotations

import contextlib
import math
import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    model_validator,
)

from posdebias._inputs import STATE_LIMIT, parse_json, read_input_text
from posdebias._io import atomic_write_text
from posdebias._version import __version__
from posdebias.decoders.base import Decoder
from posdebias.errors import InputError, validation_message
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.divergence import DivergenceProfile
from posdebias.evaluation.groups import GroupStatistics
from posdebias.evaluation.judging import JudgeMetrics
from posdebias.evaluation.metrics import Metrics
from posdebias.evaluation.ranking_metrics import RankingStatistics
from posdebias.evaluation.statistics import RunStatistics
from posdebias.registry import get_registry

RESULTS_SCHEMA_VERSION: Literal[2] = 2
#: Versions this reader understands (1 is upgraded on reading).
READABLE_SCHEMA_VERSIONS = (1, 2)


def package_versions() -> dict[str, str]:
    """Versions of posdebias and the libraries that change numbers."""
    versions = {"posdebias": __version__, "python": platform.python_version()}
    for name in ("numpy", "torch", "transformers", "open_clip_torch", "pydantic"):
        with contextlib.suppress(PackageNotFoundError):  # not installed: not recorded
            versions[name] = version(name)
    return versions


class RunSettings(EvaluateConfig):
    """The run's configuration as validated (every default filled in), without ``out``: two
    identical runs into different folders write identical settings."""

    out: Path | None = Field(default=None, exclude=True)


class AdapterDescription(BaseModel):
    """What the adapter reports about itself (``Adapter.describe``); an adapter plugin may add
    keys of its own, which are kept as written."""

    model_config = ConfigDict(extra="allow")

    adapter: str = Field(description="registry name of the adapter")
    model_id: str | None = Field(default=None, description="model id or path")
    revision: str | None = Field(default=None, description="the model's commit hash, if known")
    model_type: str | None = Field(default=None, description="the model config's model_type")
    dtype: str | None = Field(default=None, description="weights' dtype, e.g. float32")
    device: str | None = Field(default=None, description="where the model ran")
    num_layers: int | None = Field(default=None, description="decoder layers of the model")
    layers: list[int] | None = Field(default=None, description="layers attention is read from")
    layer_kinds: list[str] | None = Field(default=None, description="kind of each layer")
    label_set: str | None = Field(default=None, description="how candidates are labelled")
    labels: list[str] | None = Field(default=None, description="the N labels shown")
    prompt_hash: str | None = Field(default=None, description="SHA-256 of the prompt template")
    image_size: int | None = Field(default=None, description="image resize, if any")
    logits_processors: str | None = Field(default=None, description="logits processors used")
    prompt: dict[str, Any] | None = Field(default=None, description="the prompt template")
    end_token: str | None = Field(default=None, description="the end-of-turn token")
    answer_prefix: str | None = Field(default=None, description="text before the answer label")
    prompt_variant: str | None = Field(default=None, description="the prompt variant")
    transformers: str | None = Field(default=None, description="transformers version")
    options: dict[str, Any] | None = Field(default=None, description="adapter options")


class SourceDescription(BaseModel):
    """Where the instances came from: a benchmark (identified by content hash) or the
    simulated model's own instances; keys a newer version adds are kept."""

    model_config = ConfigDict(extra="allow")

    source: str | None = Field(default=None, description="'synthetic' for simulated instances")
    n: int | None = Field(default=None, description="N of simulated instances")
    benchmark: str | None = Field(default=None, description="benchmark path as given")
    benchmark_sha256: str | None = Field(default=None, description="benchmark content hash")
    calibration_benchmark_sha256: str | None = Field(
        default=None, description="content hash of a separate calibration benchmark"
    )


class Timing(BaseModel):
    """Seconds and memory of the run: the only section that differs between two identical
    runs. Keys a newer version adds are kept."""

    model_config = ConfigDict(extra="allow")

    calibration_seconds: float | None = Field(default=None, description="fitting, s")
    evaluation_seconds: float | None = Field(default=None, description="test instances, s")
    total_seconds: float | None = Field(default=None, description="the whole run, s")
    seconds_per_instance: dict[str, float] = Field(
        default_factory=dict,
        description="row -> seconds per test instance (all orders): its forward passes x "
        "seconds_per_forward_pass + its own arithmetic (decoders: their measured decoding)",
    )
    seconds_per_forward_pass: float | None = Field(
        default=None,
        description="mean seconds of one prompt pass run in this process (calibration and "
        "evaluation); absent when every observation was reused",
    )
    instances_evaluated_in_this_process: int | None = Field(
        default=None, description="0 when every record was reused by --resume"
    )
    world_size: int | None = Field(default=None, description="data-parallel processes")
    peak_rss_mb: float | None = Field(default=None, description="peak resident memory, MB")
    cuda_max_allocated_mb: float | None = Field(default=None, description="peak GPU memory, MB")


class Cost(BaseModel):
    """What a row costs per test instance, all T orders together (reproducible: seconds are in
    ``timing``)."""

    model_config = ConfigDict(extra="forbid")

    forward_passes_per_instance: float = Field(
        default=0.0, description="prompt passes plus decoding steps"
    )
    generated_tokens_per_instance: float = Field(default=0.0, description="decoded tokens")


class CalibrationSource(BaseModel):
    """Where a calibrator's state came from: fitted in this run or loaded from a file."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["fitted", "saved"]
    model_id: str | None = Field(default=None, description="saved: the model it was fitted on")
    transfer: bool | None = Field(
        default=None, description="saved: whether use on another model was allowed"
    )


class CalibratorResult(BaseModel):
    """One row of the table: a calibrator or a decoder."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="registry name")
    options: dict[str, Any] = Field(description="the row's options (each row's own schema)")
    metrics: Metrics
    cost: Cost = Field(default_factory=Cost)
    diagnostics: dict[str, Any] = Field(
        default_factory=dict,
        description="what the calibration found (each calibrator's own; CalibrationState)",
    )
    calibration: CalibrationSource | None = Field(
        default=None, description="calibrators: fitted in the run, or saved (model, transfer)"
    )
    kind: Literal["calibrator", "decoder"] = Field(default="calibrator")
    order_independent: bool = Field(
        default=False,
        description="the same candidate is chosen under every order by construction (cloze): "
        "Cons. and RStd measure nothing about position and the tables do not show them",
    )


class PluginVersion(BaseModel):
    """Which plugin distribution provided the run's adapter or one of its rows."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    name: str
    plugin: str | None = None
    distribution: str | None = None
    version: str | None = None


def plugin_versions(adapter: object, rows: Mapping[str, object]) -> list[PluginVersion]:
    """The plugin and distribution (with its version) behind the adapter and every row."""
    registry = get_registry()
    entries = [("adapter", adapter)] + [
        ("decoder" if isinstance(row, Decoder) else "calibrator", row) for row in rows.values()
    ]
    found = []
    for kind, obj in entries:
        info = registry.plugin_of(kind, type(obj))
        found.append(
            PluginVersion(
                kind=kind,
                name=str(getattr(obj, "name", type(obj).__name__)),
                plugin=info.name if info else None,
                distribution=info.distribution if info else None,
                version=info.version if info else None,
            )
        )
    return found


class EvaluationResults(BaseModel):
    """Every setting needed to reproduce a run, and the metrics of each calibrator.

    Timings live in ``timing`` alone so that two identical runs give identical files apart from
    that section.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = RESULTS_SCHEMA_VERSION
    settings: RunSettings
    adapter: AdapterDescription
    source: SourceDescription = Field(default_factory=SourceDescription)
    versions: dict[str, str] = Field(
        default_factory=package_versions, description="library -> version that made the numbers"
    )
    n: int = Field(description="candidates per instance")
    orders: int = Field(description="candidate orders T per test instance")
    seed: int
    num_instances: int = Field(description="test instances")
    calibration_ids: list[str] = Field(default_factory=list)
    test_ids: list[str] = Field(default_factory=list)

    @field_serializer("adapter")
    def _adapter_as_described(self, adapter: AdapterDescription) -> dict[str, Any]:
        """The adapter's own description, key for key (``run.json`` holds the same): fields
        the adapter did not report are left out, not written as null."""
        return adapter.model_dump(mode="json", exclude_unset=True)

    calibrators: dict[str, CalibratorResult] = Field(description="label -> row (table order)")
    failed: dict[str, str] = Field(
        default_factory=dict, description="label -> why a third-party calibrator was dropped"
    )
    plugins: list[PluginVersion] = Field(default_factory=list)
    divergence: DivergenceProfile | None = None
    judge: dict[str, JudgeMetrics] | None = Field(
        default=None,
        description="pairwise judge runs: per row, position consistency, the position an "
        "inconsistent verdict favours, agreement with the human votes",
    )
    statistics: RunStatistics | None = Field(
        default=None, description="intervals and paired tests; absent in files of version 1"
    )
    ranking: RankingStatistics | None = Field(
        default=None, description="nDCG@k, MRR, Recall@k of the rows that rank (N >= 3)"
    )
    groups: GroupStatistics | None = Field(
        default=None, description="per-group and macro-averaged rows, when groups are named"
    )
    timing: Timing = Field(default_factory=Timing)

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationResults:
        """Every table and figure can be drawn: shapes agree with N, numbers are finite."""
        n = self.n
        if n < 2:
            raise ValueError(f"n must be at least 2, got {n}")
        if not self.calibrators:
            raise ValueError("calibrators is empty: a results file holds at least one")
        for label, result in self.calibrators.items():
            m = result.metrics
            if len(m.confusion) != n or any(len(row) != n for row in m.confusion):
                raise ValueError(f"calibrators.{label}.metrics.confusion is not {n}x{n}")
            for name in ("recall_per_position", "selection_rate"):
                if len(getattr(m, name)) != n:
                    raise ValueError(f"calibrators.{label}.metrics.{name} has not {n} values")
            values = [m.accuracy_mean, m.accuracy_std, m.rstd, m.consistency]
            values += [v for row in m.confusion for v in row if v is not None]
            values += [v for v in m.recall_per_position if v is not None]
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"calibrators.{label}.metrics holds NaN or infinite values")
        if self.statistics is not None:
            self._statistics_fit(n)
        sections: dict[str, Mapping[str, object]] = {
            "ranking.rows": self.ranking.rows if self.ranking else {},
            "groups.rows": self.groups.rows if self.groups else {},
            "groups.macro": self.groups.macro if self.groups else {},
            "judge": self.judge or {},
        }
        for name, rows in sections.items():
            unknown = [label for label in rows if label not in self.calibrators]
            if unknown:
                raise ValueError(f"{name} names {unknown[:3]}, not rows of calibrators")
        if self.divergence is not None:
            for name in ("label_probabilities", "raw_attention", "purified_attention"):
                matrix = getattr(self.divergence, name)
                if matrix is not None and (
                    len(matrix) != n or any(len(row) != n for row in matrix)
                ):
                    raise ValueError(f"divergence.{name} is not {n}x{n}")
            for entry in self.divergence.layers or []:
                if entry.prior_peak is not None and not 0 <= entry.prior_peak < n:
                    raise ValueError(
                        f"divergence.layers: prior_peak {entry.prior_peak} not in 0..{n - 1}"
                    )
                shares = [entry.selected, entry.raw_truth, entry.raw_positional]
                shares += [entry.purified_truth, entry.purified_positional]
                if not all(v is None or 0 <= v <= 1 for v in shares):
                    raise ValueError(
                        f"divergence.layers: layer {entry.layer} has a share outside 0..1"
                    )
        return self

    def _statistics_fit(self, n: int) -> None:
        """The statistics describe exactly these rows at this N (a results file edited by hand
        could rename a row in one place only)."""
        stats = self.statistics
        assert stats is not None
        if set(stats.rows) != set(self.calibrators):
            raise ValueError(
                f"statistics.rows {list(stats.rows)} are not the rows of calibrators "
                f"{list(self.calibrators)}"
            )
        for label, row in stats.rows.items():
            for name in ("accuracy_by_position", "choice_by_position"):
                if len(getattr(row, name)) != n:
                    raise ValueError(f"statistics.rows.{label}.{name} has not {n} values")
        for comparison in stats.comparisons:
            for label in (comparison.row, comparison.baseline):
                if label not in self.calibrators:
                    raise ValueError(f"statistics.comparisons names {label!r}, not a row")

    def generated_rows(self) -> list[str]:
        """Labels of the decoder rows (they carry a parse-failure rate)."""
        return [label for label, result in self.calibrators.items() if result.kind == "decoder"]

    def order_independent_rows(self) -> list[str]:
        """Labels of the rows whose choice cannot depend on the order (cloze)."""
        return [label for label, result in self.calibrators.items() if result.order_independent]

    def metrics(self) -> dict[str, Metrics]:
        return {label: result.metrics for label, result in self.calibrators.items()}

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EvaluationResults:
        """Read a results file; a missing or invalid one is an InputError naming it."""
        source = Path(path)
        text = read_input_text(
            source,
            "results file",
            limit=STATE_LIMIT,
            hint="run `posdebias evaluate --out DIR` first",
        )
        try:
            return cls.model_validate(upgrade(parse_json(text, f"results file {source}"), source))
        except ValidationError as exc:
            raise InputError(
                validation_message(exc, f"{source} is not a valid posdebias results file")
                + "; nothing was written. Re-run `posdebias evaluate --out DIR --resume` to "
                "rebuild it"
            ) from None
        except ValueError as exc:
            raise InputError(
                f"{source} is not a valid posdebias results file ({exc}); nothing was written"
            ) from None


def upgrade(data: Any, source: Path) -> Any:
    """A parsed results file as version 2: version 1 differs only in lacking ``statistics``;
    a newer version is refused (a newer posdebias wrote it)."""
    if not isinstance(data, dict):
        return data  # validation names what is wrong
    version = data.get("schema_version", 1)
    if isinstance(version, int) and not isinstance(version, bool):
        if version > RESULTS_SCHEMA_VERSION:
            raise InputError(
                f"{source} has results schema version {version}; this posdebias reads versions "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}. Upgrade posdebias to read it"
            )
        if version == 1:
            return {**data, "schema_version": RESULTS_SCHEMA_VERSION}
    return data
