"""A run directory: append-only logs while running, atomic final files, safe resumption.

Layout of ``--out DIR``::

    run.json                   what defines the observations (checked by --resume)
    observations[.rankR].jsonl one line per forward pass: cache key + Observation
    records[.rankR].jsonl      one line per test instance: orders, targets, choices
    generations[.rankR].jsonl  one line per decoder decision: texts, parsed answers, cost
    states/<label>.json        fitted calibration states
    results.json               the typed report (written last, atomically)

Logs are appended and fsynced line by line; a process killed mid-line leaves one torn line,
which resumption drops (that record is redone), so nothing is duplicated or lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from posdebias._io import JsonlAppender, atomic_write_json, read_jsonl_records, truncate_torn_tail
from posdebias.core.observation import Observation
from posdebias.errors import OutputError, ResumeError
from posdebias.evaluation.runner import InstanceRecord, ObservationCache

RUN_FILE = "run.json"


class PersistentObservationCache(ObservationCache):
    """An observation cache that also appends every new observation to a JSONL log."""

    def __init__(self, log: JsonlAppender | None = None) -> None:
        super().__init__()
        self._log = log

    def load(self, paths: list[Path]) -> int:
        """Read earlier observation logs (all ranks); returns how many were loaded."""
        for path in paths:
            for row in read_jsonl_records(path):
                self._store[row["key"]] = Observation.from_dict(row["observation"])
        return len(self._store)

    def put(self, key: str, observation: Observation) -> None:
        super().put(key, observation)
        if self._log is not None:
            self._log.append({"key": key, "observation": observation.to_dict()})


class RunDirectory:
    """Files of one evaluation run (see the module docstring)."""

    def __init__(self, root: str | Path, *, rank: int | None = None) -> None:
        self.root = Path(root)
        self.rank = rank
        suffix = "" if rank is None else f".rank{rank}"
        self.observations_path = self.root / f"observations{suffix}.jsonl"
        self.records_path = self.root / f"records{suffix}.jsonl"
        self.generations_path = self.root / f"generations{suffix}.jsonl"
        self.states_dir = self.root / "states"
        self.results_path = self.root / "results.json"

    # -- identity and resumption -------------------------------------------------------------

    def prepare(self, identity: Mapping[str, Any], *, resume: bool) -> None:
        """Create the directory, or check that it belongs to the same run when resuming.

        Without ``--resume`` a directory holding an earlier run's logs is refused rather than
        silently mixed or overwritten.
        """
        run_file = self.root / RUN_FILE
        if run_file.exists():
            try:
                saved = json.loads(run_file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ResumeError(f"{run_file} is corrupt ({exc}); use a new --out") from exc
            if not resume:
                raise ResumeError(
                    f"{self.root} already holds a run; add --resume to continue it or choose "
                    "another --out directory"
                )
            differences = [
                f"{key}: {saved.get(key)!r} there, {identity.get(key)!r} now"
                for key in sorted(set(saved) | set(identity))
                if saved.get(key) != identity.get(key)
            ]
            if differences:
                raise ResumeError(
                    f"cannot resume {self.root}: it was made with a different configuration ("
                    + "; ".join(differences)
                    + "). Use the original settings or a new --out directory."
                )
        else:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"cannot create output directory {self.root}: {exc}") from exc
            if self.rank in (None, 0):
                atomic_write_json(run_file, dict(identity))

    def observation_logs(self) -> list[Path]:
        return sorted(self.root.glob("observations*.jsonl"))

    def record_logs(self) -> list[Path]:
        return sorted(self.root.glob("records*.jsonl"))

    def open_observation_log(self) -> JsonlAppender:
        truncate_torn_tail(self.observations_path)
        return JsonlAppender(self.observations_path)

    def generation_logs(self) -> list[Path]:
        return sorted(self.root.glob("generations*.jsonl"))

    def open_generation_log(self) -> JsonlAppender:
        truncate_torn_tail(self.generations_path)
        return JsonlAppender(self.generations_path)

    def open_record_log(self) -> JsonlAppender:
        truncate_torn_tail(self.records_path)
        return JsonlAppender(self.records_path)

    def read_records(self) -> dict[str, InstanceRecord]:
        """Completed instance records from every rank's log; a later line for the same
        instance (re-evaluated with more calibrators) replaces the earlier one."""
        records: dict[str, InstanceRecord] = {}
        for path in self.record_logs():
            for row in read_jsonl_records(path):
                records[row["instance_id"]] = InstanceRecord.from_dict(row)
        return records

    def iter_state_files(self) -> Iterator[Path]:
        yield from sorted(self.states_dir.glob("*.json"))
