"""The typed schema of a results file (``results.json``)."""

from __future__ import annotations

import math
import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posdebias._io import atomic_write_text
from posdebias._version import __version__
from posdebias.decoders.base import Decoder
from posdebias.errors import InputError, validation_message
from posdebias.evaluation.divergence import DivergenceProfile
from posdebias.evaluation.metrics import Metrics
from posdebias.registry import get_registry

RESULTS_SCHEMA_VERSION = 1


def package_versions() -> dict[str, str]:
    """Versions of posdebias and the libraries that change numbers."""
    versions = {"posdebias": __version__, "python": platform.python_version()}
    for name in ("numpy", "torch", "transformers", "open_clip_torch", "pydantic"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            continue
    return versions


class CalibratorResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    options: dict[str, Any]
    metrics: Metrics
    cost: dict[str, float] = Field(default_factory=dict)
    diagnostics: dict[str, Any] = Field(
        default_factory=dict, description="what the calibration found (CalibrationState)"
    )
    calibration: dict[str, Any] | None = Field(
        default=None,
        description="where the state came from: fitted in the run, or saved (model, transfer)",
    )
    kind: str = Field(default="calibrator", description="calibrator or decoder")


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

    schema_version: int = RESULTS_SCHEMA_VERSION
    settings: dict[str, Any]
    adapter: dict[str, Any]
    source: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=package_versions)
    n: int
    orders: int
    seed: int
    num_instances: int
    calibration_ids: list[str] = Field(default_factory=list)
    test_ids: list[str] = Field(default_factory=list)
    calibrators: dict[str, CalibratorResult]
    failed: dict[str, str] = Field(
        default_factory=dict, description="label -> why a third-party calibrator was dropped"
    )
    plugins: list[PluginVersion] = Field(default_factory=list)
    divergence: DivergenceProfile | None = None
    timing: dict[str, Any] = Field(default_factory=dict)

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
        if self.divergence is not None:
            for name in ("label_probabilities", "raw_attention", "purified_attention"):
                matrix = getattr(self.divergence, name)
                if matrix is not None and (
                    len(matrix) != n or any(len(row) != n for row in matrix)
                ):
                    raise ValueError(f"divergence.{name} is not {n}x{n}")
        return self

    def generated_rows(self) -> list[str]:
        """Labels of the decoder rows (they carry a parse-failure rate)."""
        return [label for label, result in self.calibrators.items() if result.kind == "decoder"]

    def metrics(self) -> dict[str, Metrics]:
        return {label: result.metrics for label, result in self.calibrators.items()}

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EvaluationResults:
        """Read a results file; a missing or invalid one is an InputError naming it."""
        source = Path(path)
        if not source.is_file():
            raise InputError(
                f"results file {source} does not exist; run `posdebias evaluate --out DIR` first"
            )
        try:
            return cls.model_validate_json(source.read_text(encoding="utf-8"))
        except ValidationError as exc:
            raise InputError(
                validation_message(exc, f"{source} is not a valid posdebias results file")
                + "; nothing was written. Re-run `posdebias evaluate --out DIR --resume` to "
                "rebuild it"
            ) from None
        except ValueError as exc:
            raise InputError(
                f"{source} is not a valid posdebias results file ({exc!s:.120}); nothing was "
                "written"
            ) from None
