"""Saving a set of calibration states: safe file names, all files at once or none."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from posdebias._io import remove_stale, write_files_together
from posdebias._rundir import RunFolder
from posdebias.core.state import CalibrationState
from posdebias.errors import ConfigError, OutputError
from posdebias.evaluation.config import SAFE_LABEL


def check_label(label: str) -> str:
    """``label`` if it is safe as a file name, else a ConfigError saying what is allowed."""
    if not isinstance(label, str) or not SAFE_LABEL.fullmatch(label) or label.endswith("."):
        shown = repr(label)[:70]
        raise ConfigError(
            f"calibrator label {shown} cannot name a file: use 1 to 64 letters, digits, '_', "
            "'.' or '-', starting with a letter or digit"
        )
    return label


#: A state file of a folder of states: ``<label>.json`` (see :data:`SAFE_LABEL`).
_STATE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\.json\Z")


def states_folder(folder: str | Path, *, flag: str = "--out") -> RunFolder:
    """A folder of calibration states (``posdebias calibrate --out DIR``) through the one
    run-directory layer: a folder is ours when it holds only state files, which are never
    links; it is locked while states are fitted and written."""
    return RunFolder(
        folder, marker=None, own=_STATE_FILE, kind="folder of calibration states", flag=flag
    )


def save_states(states: Mapping[str, CalibrationState], folder: str | Path) -> list[Path]:
    """Write ``<label>.json`` for every state into ``folder``, together or not at all.

    A folder holding other files than calibration states is refused: saving must not replace
    a file we did not make.
    """
    root = Path(folder)
    files = {
        f"{check_label(label)}.json": state.to_json().encode() for label, state in states.items()
    }
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root} is a file; give a folder for the calibration states")
    if root.is_dir():
        remove_stale(root)
        for name in files:
            existing = root / name
            if existing.is_symlink() or (existing.exists() and not _is_state(existing)):
                raise OutputError(
                    f"{existing} exists and is not a calibration state; posdebias does not "
                    "replace files it did not make: move it or choose another folder"
                )
    return write_files_together(root, files)


def _is_state(path: Path) -> bool:
    try:
        CalibrationState.load(path)
    except Exception:  # any reason it is not ours: do not replace it
        return False
    return True
