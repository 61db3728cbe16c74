"""A run directory: append-only logs while running, atomic final files, safe resumption.

Layout of ``--out DIR``::

    run.json                   what defines the observations (checked by --resume)
    .posdebias.lock            held while a process writes here (a second one is refused)
    observations[.rankR].jsonl one line per forward pass: cache key + Observation
    records[.rankR].jsonl      one line per test instance: orders, targets, choices
    generations[.rankR].jsonl  one line per decoder decision: texts, parsed answers, cost
    states/<label>.json        fitted calibration states
    results.json               the typed report (written last, atomically)

Logs are appended and fsynced line by line; a process killed mid-line leaves one torn line,
which resumption drops (that record is redone), so nothing is duplicated or lost. Every record
names the calibrators it holds choices of by fingerprint (class, options, fitted state): a
choice whose calibrator changed since is not reused but predicted again from the cached
observations.

We write only our own files: a non-empty folder that is not a run directory is refused, files
are never written through a symbolic link, and a run that failed before its first record can
be started again with a corrected command.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from posdebias._io import (
    DirectoryLock,
    JsonlAppender,
    atomic_write_json,
    read_jsonl_records,
    remove_stale,
    truncate_torn_tail,
)
from posdebias.core.observation import Observation
from posdebias.errors import OutputError, ResumeError
from posdebias.evaluation.runner import InstanceRecord, ObservationCache

RUN_FILE = "run.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
STATES_DIR = "states"
FIGURES_DIR = "figures"
#: Everything a run directory of ours may hold (temporary names are matched separately).
_OWN_NAMES = re.compile(
    r"^(run\.json|results\.json|report\.md|states|figures|\.posdebias\.lock"
    r"|(observations|records|generations)(\.rank\d+)?\.jsonl)$"
)
_LOCK = DirectoryLock.FILE
_TEMP = re.compile(r"^\..+\.(tmp|staging)$")


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
        self.states_dir = self.root / STATES_DIR
        self.results_path = self.root / RESULTS_FILE
        self._lock = DirectoryLock(self.root)

    # -- ownership, locking and identity -----------------------------------------------------

    def check_ours(self) -> None:
        """Refuse a folder we did not make: a non-empty folder that is not a run directory,
        or one whose files are symbolic links (writing there would change their targets)."""
        if not self.root.exists():
            return
        if not self.root.is_dir():
            raise OutputError(f"--out {self.root} is a file; give a folder for the run")
        entries = sorted(self.root.iterdir())
        links = [e.name for e in entries if e.is_symlink() and _OWN_NAMES.match(e.name)]
        for sub in (STATES_DIR, FIGURES_DIR):
            folder = self.root / sub
            if folder.is_dir() and not folder.is_symlink():
                links += [f"{sub}/{e.name}" for e in sorted(folder.iterdir()) if e.is_symlink()]
        if links:
            raise OutputError(
                f"--out {self.root} holds symbolic links where the run keeps its own files "
                f"({', '.join(links[:5])}); posdebias does not write through links: remove "
                "them or choose another --out"
            )
        if (self.root / RUN_FILE).is_file() and not (self.root / RUN_FILE).is_symlink():
            foreign = []
        else:  # no run of ours: only what a run leaves before its run.json may be there
            foreign = [e.name for e in entries if not (e.name == _LOCK or _TEMP.match(e.name))]
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise OutputError(
                f"--out {self.root} is not empty and is not a posdebias run directory (it holds "
                f"{shown}); posdebias writes only into a new or empty folder or one of its own "
                "runs: choose another --out"
            )

    def lock(self) -> None:
        """Take the directory's exclusive lock and clear what a killed writer left behind."""
        self._lock.acquire()
        for folder in (self.root, self.states_dir, self.root / FIGURES_DIR):
            remove_stale(folder, locked=True)

    def unlock(self) -> None:
        self._lock.release()

    def started(self) -> bool:
        """Whether the run has produced anything beyond its set-up (a record or results)."""
        if self.results_path.exists():
            return True
        return any(path.stat().st_size > 0 for path in self.record_logs())

    def prepare(self, identity: Mapping[str, Any], *, resume: bool) -> None:
        """Create the directory, or check that it belongs to the same run when resuming.

        Without ``--resume`` a directory holding an earlier run's records is refused rather
        than silently mixed or overwritten. A run that failed before its first record (a bad
        input found late) is started again: with the same configuration it keeps its cached
        observations, with another one it starts afresh.
        """
        self.check_ours()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create output directory {self.root}: {exc}") from exc
        if self.rank in (None, 0):
            self.lock()
        run_file = self.root / RUN_FILE
        if not run_file.exists():
            if self.rank in (None, 0):
                atomic_write_json(run_file, dict(identity))
            return
        try:
            saved = json.loads(run_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ResumeError(f"{run_file} is corrupt ({exc}); use a new --out") from exc
        if not isinstance(saved, dict):
            raise ResumeError(f"{run_file} is corrupt (not a JSON object); use a new --out")
        differences = [
            f"{key}: {saved.get(key)!r} there, {identity.get(key)!r} now"
            for key in sorted(set(saved) | set(identity))
            if saved.get(key) != identity.get(key)
        ]
        if not self.started():
            if differences and self.rank in (None, 0):
                self._reset()
                atomic_write_json(run_file, dict(identity))
            return
        if not resume:
            raise ResumeError(
                f"{self.root} already holds a run; add --resume to continue it or choose "
                "another --out directory"
            )
        if differences:
            raise ResumeError(
                f"cannot resume {self.root}: it was made with a different configuration ("
                + "; ".join(differences)
                + "). Use the original settings or a new --out directory."
            )

    def _reset(self) -> None:
        """Forget a run that never produced a record (its observations belong to another
        configuration): only files of ours are removed."""
        for path in self.observation_logs() + self.generation_logs() + self.record_logs():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self.states_dir.is_dir() and not self.states_dir.is_symlink():
            shutil.rmtree(self.states_dir, ignore_errors=True)

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
        instance (re-evaluated with more or changed calibrators) replaces the earlier one."""
        records: dict[str, InstanceRecord] = {}
        for path in self.record_logs():
            for row in read_jsonl_records(path):
                try:
                    record = InstanceRecord.from_dict(row)
                except (KeyError, TypeError, ValueError) as exc:
                    raise OutputError(
                        f"{path}: a record is not one posdebias wrote ({exc!s:.80}); delete the "
                        "run directory and start again without --resume"
                    ) from exc
                records[record.instance_id] = record
        return records

    def iter_state_files(self) -> Iterator[Path]:
        yield from sorted(self.states_dir.glob("*.json"))
