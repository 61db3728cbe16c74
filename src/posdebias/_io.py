"""Atomic file writes and append-only JSONL logs: nothing half-written is ever left behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posdebias.errors import OutputError


def _output_error(path: Path, exc: OSError) -> OutputError:
    if exc.errno == errno.ENOSPC:
        why = "the disk is full"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied"
    else:
        why = exc.strerror or str(exc)
    return OutputError(f"cannot write {path}: {why}. Choose another output location or free space.")


def cache_root() -> Path:
    """Where posdebias caches what it can rebuild (CLIP embeddings, the bundled benchmark):
    ``$POSDEBIAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/posdebias`` or ``~/.cache/posdebias``."""
    if os.environ.get("POSDEBIAS_CACHE_DIR"):
        return Path(os.environ["POSDEBIAS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "posdebias"


def _read_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


_UMASK = _read_umask()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it into place.

    Readers see either the old file or the complete new one, never a truncated file.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _output_error(target, exc) from exc
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; final files get normal modes
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise _output_error(target, exc) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Atomically write UTF-8 text (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], payload: Any) -> Path:
    """Atomically write ``payload`` as indented, key-sorted JSON with a trailing newline."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


class JsonlAppender:
    """Append JSON records one line at a time, flushed and fsynced, for crash-safe run logs.

    A process killed mid-write can leave at most one truncated last line;
    :func:`read_jsonl_records` drops such a line so that resuming redoes that record.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise _output_error(self.path, exc) from exc

    def append(self, record: Any) -> None:
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        try:
            self._handle.write(line)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise _output_error(self.path, exc) from exc

    def close(self) -> None:
        # every append was flushed and fsynced; only a line whose append already failed (and
        # was reported) can still sit in the buffer, so a close error adds nothing to report
        with contextlib.suppress(OSError):
            self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_jsonl_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the complete records of an append-only log, dropping a torn final line.

    A torn line can only be the last one (we append and fsync line by line); a bad line
    anywhere else means the file was edited, so it raises.
    """
    source = Path(path)
    if not source.exists():
        return
    if not source.is_file():
        raise OutputError(f"{source} is not a regular file; remove it or use another --out")
    lines = source.read_text(encoding="utf-8").split("\n")
    complete = lines[:-1]  # after the last newline: a torn line or ''
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise OutputError(
                f"{source}:{number}: the run log is corrupt ({exc.msg}); "
                "delete the run directory and start again without --resume"
            ) from exc


def truncate_torn_tail(path: str | os.PathLike[str]) -> None:
    """Cut a partial last line (left by a killed writer) so appends start on a fresh line."""
    source = Path(path)
    if not source.is_file():  # missing, or a device/pipe the caller chose: nothing to mend
        return
    data = source.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(source, "r+b") as handle:
            handle.truncate(cut)
