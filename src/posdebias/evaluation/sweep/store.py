"""A study's run directory, through the one run-directory layer (:mod:`posdebias._rundir`).

Layout of ``--out DIR``::

    sweep.json          what defines the study (checked by --resume), with its format version
    .posdebias.lock     held while a process writes here (a second one is refused)
    observations.jsonl  the shared observation cache (append-only, crash-safe)
    generations.jsonl   the decoder rows' generated answers, shared by every point
    points/NNN.json     one finished point: its rows and the observations it used
    results.csv, figure.png, report.md
    timing.json         seconds per point (the only file that differs between reruns)

Every file is read as a regular file of bounded size (never through a link) and validated, so
a replaced, linked or edited file is an exit-2 error naming it, and a swapped benchmark (its
content hash is part of the identity) refuses ``--resume``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

import posdebias.defaults as defaults
from posdebias._rundir import FORMAT_KEY, FORMAT_VERSION, RunFolder
from posdebias.errors import ResumeError
from posdebias.evaluation.metrics import Percent
from posdebias.evaluation.store import differing, read_identity

SWEEP_FILE = "sweep.json"
POINTS_DIR = "points"
TIMING_FILE = "timing.json"
OBSERVATIONS_FILE = "observations.jsonl"
#: The decoder rows' generated answers (one JSON line per decided view), shared by every point.
GENERATIONS_FILE = "generations.jsonl"
_OWN = re.compile(
    r"^(sweep\.json|observations\.jsonl|generations\.jsonl|points|timing\.json"
    r"|results\.csv|figure\.(png|pdf|svg)|report\.md)\Z"
)


class _Saved(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


Count = Annotated[int, Field(ge=0, le=10**12)]
Seconds = Annotated[float, Field(ge=0, le=10**9)]


class PointRow(_Saved):
    """One calibrator's row of a finished point, as :func:`run_point` writes it."""

    study: str
    point: str
    value: int | float | str
    calibration_benchmark: str
    benchmark: str
    n: Annotated[int, Field(ge=defaults.MIN_CANDIDATES, le=defaults.MAX_CANDIDATES)]
    orders: Annotated[int, Field(ge=1, le=defaults.MAX_ORDERS)]
    instances: Annotated[int, Field(ge=1, le=defaults.MAX_INSTANCES)]
    calibration_instances: Count
    calibrator: str
    # in the order of results.csv; the 95% bootstrap intervals are absent in points an older
    # version wrote; RStd and Cons. None for an order-independent row (cloze): no position bias
    accuracy: Percent
    accuracy_std: Percent
    accuracy_low: Percent | None = None
    accuracy_high: Percent | None = None
    rstd: Percent | None
    rstd_low: Percent | None = None
    rstd_high: Percent | None = None
    consistency: Percent | None
    consistency_low: Percent | None = None
    consistency_high: Percent | None = None
    forward_passes_per_instance: Annotated[float, Field(ge=0, le=10**9)]


class PointFile(_Saved):
    """``points/NNN.json``."""

    label: str
    rows: Annotated[list[PointRow], Field(min_length=1)]
    keys: list[Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]]


class PointTiming(_Saved):
    seconds: Seconds
    observations_made_in_this_process: Count


class TimingFile(_Saved):
    """``timing.json``."""

    points: dict[str, PointTiming] = Field(default_factory=dict)
    total_seconds_last_invocation: Seconds | None = None


class SweepDirectory:
    """The files of one study (see the module docstring)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.folder = RunFolder(
            self.out,
            marker=SWEEP_FILE,
            own=_OWN,
            subfolders=(POINTS_DIR,),
            kind="posdebias sweep directory",
        )

    def prepare(
        self,
        identity: dict[str, Any],
        *,
        resume: bool,
        read_saved: Callable[[dict[str, Any]], dict[str, Any]] = dict,
    ) -> None:
        """Create the directory, or check (under its lock) that it holds the same study
        (``read_saved`` reads the identity an older version saved in today's terms)."""
        folder = self.folder
        folder.check()
        if folder.is_ours() and not resume:
            raise ResumeError(
                f"{self.out} already holds a sweep; add --resume to continue it or choose "
                "another --out"
            )
        folder.create()
        folder.lock()
        try:
            saved = read_identity(folder, SWEEP_FILE, "sweep file", read_saved)
            if saved is None:
                folder.write_json(SWEEP_FILE, {FORMAT_KEY: FORMAT_VERSION, **identity})
            elif saved != identity:
                shown = "; ".join(differing(saved, identity)[:10])
                raise ResumeError(
                    f"cannot resume {self.out}: it was made with a different study or "
                    f"configuration (differs in: {shown}). Use the original settings or a new "
                    "--out."
                )
            folder.path(f"{POINTS_DIR}/x")  # a linked or planted points/ is refused
            (self.out / POINTS_DIR).mkdir(exist_ok=True)
        except BaseException:
            folder.unlock()
            raise

    # -- points and timing ------------------------------------------------------------------

    def point_path(self, index: int) -> Path:
        return self.out / POINTS_DIR / f"{index:03d}.json"

    def read_point(self, index: int, label: str) -> dict[str, Any] | None:
        """A finished point's payload (validated), or None when it is not there or was made
        for another label (then it is made again)."""
        relative = f"{POINTS_DIR}/{index:03d}.json"
        payload = self.folder.read_json(relative, "sweep point file")
        if payload is None:
            return None
        saved = self.folder.validate(payload, PointFile, relative, "sweep point file")
        return payload if saved.label == label else None

    def write_point(self, index: int, payload: dict[str, Any]) -> None:
        self.folder.write_json(f"{POINTS_DIR}/{index:03d}.json", payload)

    def read_timing(self) -> dict[str, Any]:
        saved = self.folder.read_model(TIMING_FILE, TimingFile, "sweep timing file")
        if saved is None:
            return {"points": {}}
        return saved.model_dump(exclude_none=True)

    def write_timing(self, timing: dict[str, Any]) -> None:
        self.folder.write_json(TIMING_FILE, timing)
