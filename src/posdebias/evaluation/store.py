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
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from posdebias._inputs import excerpt
from posdebias._io import numbered_jsonl_records
from posdebias._rundir import FORMAT_KEY, FORMAT_VERSION, RunFolder
from posdebias.errors import OutputError, ResumeError
from posdebias.evaluation.runner import InstanceRecord

RUN_FILE = "run.json"
RESULTS_FILE = "results.json"
STATES_DIR = "states"
FIGURES_DIR = "figures"
#: Everything a run directory of ours may hold (temporary names are matched separately).
_OWN_NAMES = re.compile(
    r"^(run\.json|results\.json|report\.md|states|figures|\.posdebias\.lock"
    r"|(observations|records|generations)(\.rank\d+)?\.jsonl)\Z"
)


def differing(saved: Mapping[str, Any], now: Mapping[str, Any], where: str = "") -> list[str]:
    """Each setting that differs between two run or study identities, named by its path
    (``adapter.prompt.query``, ``points.0.config.orders``: nested settings and lists of the
    same length are compared item by item, so the message names the one that changed)."""
    found = []
    for key in sorted(set(saved) | set(now), key=str):
        there, here = saved.get(key), now.get(key)
        if there == here:
            continue
        name = f"{where}{key}"
        if isinstance(there, list) and isinstance(here, list) and len(there) == len(here):
            there, here = dict(enumerate(there)), dict(enumerate(here))
        if isinstance(there, dict) and isinstance(here, dict):
            found += differing(there, here, f"{name}.")
        else:
            found.append(f"{name}: {excerpt(there)} there, {excerpt(here)} now")
    return found


def read_identity(
    folder: RunFolder,
    marker: str,
    what: str,
    read_saved: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    """The identity a run or sweep directory's ``marker`` file saved, read in today's terms
    (``read_saved``); None before the directory has one."""
    saved = folder.read_json(marker, what)
    if saved is None:
        return None
    if not isinstance(saved, dict):
        raise ResumeError(f"{folder.root / marker} is corrupt (not a JSON object); use a new --out")
    return read_saved({k: v for k, v in saved.items() if k != FORMAT_KEY})


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
        self.folder = RunFolder(
            self.root, marker=RUN_FILE, own=_OWN_NAMES, subfolders=(STATES_DIR, FIGURES_DIR)
        )

    # -- ownership, locking and identity: self.folder (the one run-directory layer: _rundir) --

    def started(self) -> bool:
        """Whether the run has produced anything beyond its set-up (a record or results)."""
        records = self.logs("records")
        return self.results_path.exists() or any(path.stat().st_size > 0 for path in records)

    def prepare(
        self,
        identity: Mapping[str, Any],
        *,
        resume: bool,
        read_saved: Callable[[dict[str, Any]], dict[str, Any]] = dict,
    ) -> None:
        """Create the directory, or check that it belongs to the same run when resuming
        (``read_saved`` reads the identity an older version saved in today's terms).

        Without ``--resume`` a directory holding an earlier run's records is refused rather
        than silently mixed or overwritten. A run that failed before its first record (a bad
        input found late) is started again: with the same configuration it keeps its cached
        observations, with another one it starts afresh.
        """
        self.folder.check()  # a folder we did not make, or links where we keep our files
        self.folder.create()
        if self.rank in (None, 0):
            self.folder.lock()
        written = {FORMAT_KEY: FORMAT_VERSION, **identity}
        saved = read_identity(self.folder, RUN_FILE, "run file", read_saved)
        if saved is None:
            if self.rank in (None, 0):
                self.folder.write_json(RUN_FILE, written)
            return
        differences = differing(saved, dict(identity))
        if not self.started():
            if differences and self.rank in (None, 0):
                self._reset()
                self.folder.write_json(RUN_FILE, written)
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
        for path in self.logs("observations") + self.logs("generations") + self.logs("records"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self.states_dir.is_dir() and not self.states_dir.is_symlink():
            shutil.rmtree(self.states_dir, ignore_errors=True)

    def logs(self, kind: Literal["observations", "records", "generations"]) -> list[Path]:
        """Every rank's log of ``kind`` (``observations[.rankR].jsonl``, ...)."""
        return sorted(self.root.glob(f"{kind}*.jsonl"))

    def read_records(self) -> dict[str, InstanceRecord]:
        """Completed instance records from every rank's log; a later line for the same
        instance (re-evaluated with more or changed calibrators) replaces the earlier one."""
        records: dict[str, InstanceRecord] = {}
        for path in self.logs("records"):
            for number, row in numbered_jsonl_records(path):
                try:
                    record = InstanceRecord.from_dict(row, logged_at=f"{path}:{number}")
                except ResumeError as exc:  # the check's own words, whole
                    raise ResumeError(f"{path}:{number}: {exc}") from None
                except (KeyError, TypeError, ValueError) as exc:
                    raise OutputError(
                        f"{path}:{number}: a record is not one posdebias wrote ({exc!s:.80}); "
                        "delete the run directory and start again without --resume"
                    ) from exc
                records[record.instance_id] = record
        return records
