"""Atomic file writes and append-only JSONL logs: nothing half-written is ever left behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from posdebias._inputs import DATA_LIMIT, json_failure, loads_json, path_problem, read_input_bytes
from posdebias.errors import OutputError, ResumeError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


#: Why a write failed, by ``errno``, where the system's own words say less.
_WHY: dict[int | None, str] = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "the file system refuses a larger file (a disk quota or file-size limit)",
    errno.ELOOP: "it is a symbolic link, and posdebias does not write through links",
    errno.EEXIST: "a file stands where a folder is needed",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    **dict.fromkeys((errno.EACCES, errno.EPERM, errno.EROFS), "permission denied"),
}


def _output_error(path: Path, exc: OSError) -> OutputError:
    why = _WHY.get(exc.errno) or exc.strerror or str(exc)
    full = exc.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None))
    return OutputError(
        f"cannot write {path}: {why}. Choose another output location{' or free space' * full}."
    )


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
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

#: Temporary names carry the writer's pid, so a later process can tell a leftover of a killed
#: writer (pid gone) from a file another live process is writing right now.
_TEMP_NAME = re.compile(
    r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<rand>[A-Za-z0-9_]+)\.(?P<kind>tmp|staging)\Z"
)


def temp_prefix(name: str) -> str:
    """Prefix of a temporary file or staging folder for ``name`` (see :func:`remove_stale`)."""
    return f".{name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary files and staging folders a killed writer left in ``folder``.

    Only names this package makes (``.NAME.PID.RANDOM.tmp`` / ``.staging``) whose process is
    gone are removed. Returns what was removed.
    """
    root = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.fullmatch(entry.name)
        stale = match is not None and not _alive(int(match["pid"]))
        if not stale:
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed


def make_staging_dir(target: Path) -> Path:
    """A fresh staging folder beside ``target`` (same file system, so renames are atomic), with
    the modes of a normal folder (mkdtemp's are 0700)."""
    staging = Path(
        tempfile.mkdtemp(prefix=temp_prefix(target.name), suffix=".staging", dir=target.parent)
    )
    os.chmod(staging, 0o777 & ~_UMASK)
    return staging


class StagedFolder:
    """A whole folder written beside its ``target`` (``folder``, from :func:`make_staging_dir`)
    and renamed into place by :meth:`commit`, so that a build failing half-way never replaces
    what the target held (a shapes root other benchmarks are built on). ``staged`` False:
    the target already holds what was wanted (``folder`` is the target), nothing to swap."""

    def __init__(
        self,
        target: Path,
        folder: Path,
        *,
        staged: bool,
        replaceable: Callable[[Path], None] | None = None,
    ) -> None:
        self.target, self.folder, self.staged = target, folder, staged
        #: raises unless what stands at the target may be replaced, checked at the swap
        self.replaceable = replaceable
        self._old: Path | None = None

    def commit(self, *, keep_old: bool = False) -> None:
        """Rename the staged folder into place. The old folder there is removed, or with
        ``keep_old`` kept aside until :meth:`discard` (so that :meth:`rollback` restores it)."""
        if not self.staged or not self.folder.exists():
            return
        if self.replaceable is not None:
            self.replaceable(self.target)
        try:
            if self.target.exists():
                old = make_staging_dir(self.target)
                old.rmdir()
                os.replace(self.target, old)
                try:
                    os.replace(self.folder, self.target)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.replace(old, self.target)
                    raise
                if keep_old:
                    self._old = old
                else:
                    shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(self.folder, self.target)
        except OSError as exc:
            raise _output_error(self.target, exc) from exc

    def rollback(self) -> None:
        """Put back the folder :meth:`commit` replaced (a later step failed)."""
        if self._old is None:
            return
        with contextlib.suppress(OSError):
            shutil.rmtree(self.target)
            os.replace(self._old, self.target)
        self._old = None

    def discard(self) -> None:
        """Remove a staged folder that was not committed, and an old one kept aside."""
        if self.staged and self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        if self._old is not None:
            shutil.rmtree(self._old, ignore_errors=True)
            self._old = None


@contextlib.contextmanager
def staged_files(folder: str | os.PathLike[str], *, new: bool = False) -> Iterator[Path]:
    """A staging folder inside ``folder`` to write files into; when the block succeeds they are
    renamed into ``folder`` together (renames need no space, so a full disk fails before any
    file appears), and the staging folder is removed whatever happens (a killed writer's is
    removed by :func:`remove_stale`).

    ``new``: the files must not exist yet, as anything, a dangling link included: each is
    linked into place (which never replaces an entry), and if one name is taken the ones
    already placed are removed again, so none appears.
    """
    root = Path(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = make_staging_dir(root / ".files")
    except OSError as exc:
        raise _output_error(root, exc) from exc
    try:
        yield staging
        entries = sorted(staging.iterdir())
        for entry in entries:  # temporary writes (mkstemp) may have made 0600 files
            if entry.is_file() and not entry.is_symlink():
                os.chmod(entry, 0o666 & ~_UMASK)
        if new:
            _link_new(root, entries)
        else:
            for entry in entries:
                try:
                    os.replace(entry, root / entry.name)
                except OSError as exc:
                    raise _output_error(root / entry.name, exc) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _link_new(root: Path, entries: list[Path]) -> None:
    """Link each entry into ``root``; if one cannot be, remove the ones already placed."""
    placed: list[Path] = []
    try:
        for entry in entries:
            os.link(entry, root / entry.name, follow_symlinks=False)
            placed.append(root / entry.name)
    except OSError as exc:
        for path in placed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if isinstance(exc, FileExistsError):
            raise OutputError(
                f"{root} already holds {root / entry.name} (a file, a folder or a link); "
                "posdebias never replaces what it did not write: remove it or choose another "
                "name"
            ) from None
        raise _output_error(root / entry.name, exc) from exc


def write_files_together(
    folder: str | os.PathLike[str], files: Mapping[str, bytes], *, new: bool = False
) -> list[Path]:
    """Write several files into ``folder`` so that they appear together or not at all (see
    :func:`staged_files`; ``new``: none of them may exist yet); every file is fsynced before
    any is renamed. Returns the final paths."""
    root = Path(folder)
    with staged_files(root, new=new) as staging:
        for name, data in files.items():
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"not a plain file name: {name!r}")
            try:
                fd = os.open(
                    staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666
                )
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:
                raise _output_error(root / name, exc) from exc
    return [root / name for name in files]


class DirectoryLock:
    """An exclusive lock on a folder (``.posdebias.lock`` inside it) held while a command
    writes there; a second process is refused with the holder's pid.

    The lock is an ``flock`` on an open file, so the kernel releases it when the holder dies
    (even by SIGKILL): a stale lock file never blocks the next run.
    """

    FILE = ".posdebias.lock"

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.FILE
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        if fcntl is None:  # pragma: no cover - not POSIX: no lock, as before
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise _output_error(self.path, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _output_error(self.path, exc) from exc
            raise OutputError(
                f"{self.folder} is in use by another posdebias process (pid {holder}); wait "
                "for it to finish, or choose another output location"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except OSError as exc:  # a full disk before anything of the run is written
            os.close(fd)
            raise _output_error(self.path, exc) from exc
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it into place.

    Readers see either the old file or the complete new one, never a truncated file.
    """
    problem = path_problem(path)
    if problem is not None:  # "" is the current folder, " " a file named by a typo
        raise OutputError(problem)
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent
        )
    except OSError as exc:
        raise _output_error(target, exc) from exc
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; final files get normal modes
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise _output_error(target, exc) from exc
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
            # non-blocking open: a FIFO planted in a run directory must not hang us
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            if self.path.exists() and not self.path.is_file():
                raise _not_regular(self.path) from exc
            raise _output_error(self.path, exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _not_regular(self.path)
        os.set_blocking(fd, True)
        self._handle = open(fd, "a", encoding="utf-8")  # noqa: SIM115

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


def _not_regular(path: Path) -> OutputError:
    return OutputError(
        f"{path} is not a regular file (a pipe, device or folder); posdebias writes only its "
        "own files in a run directory: remove it or choose another --out"
    )


def read_jsonl_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the complete records of an append-only log, dropping a torn final line.

    A torn line can only be the last one (we append and fsync line by line); a bad line
    anywhere else means the file was edited, so it raises.
    """
    yield from (record for _, record in numbered_jsonl_records(path))


def numbered_jsonl_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """:func:`read_jsonl_records` with the line number of each record (for messages)."""
    source = Path(path)
    if not os.path.lexists(source):
        return
    if source.is_symlink() or not source.is_file():
        raise OutputError(f"{source} is not a regular file; remove it or use another --out")
    data = read_input_bytes(
        source, "run log", limit=DATA_LIMIT, error=ResumeError, follow_links=False
    )

    def corrupt(number: int, why: str) -> ResumeError:
        return ResumeError(
            f"{source}:{number}: the run log is corrupt ({why}); delete the run directory and "
            "start again without --resume"
        )

    lines = data.split(b"\n")
    complete = lines[:-1]  # after the last newline: a torn line or b''
    for number, raw in enumerate(complete, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise corrupt(number, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
        if not line.strip():
            continue
        try:
            value = loads_json(line)
        except (RecursionError, ValueError) as exc:
            cause = None if isinstance(exc, RecursionError) else exc  # no deep traceback
            raise corrupt(number, json_failure(exc)) from cause
        yield number, value


def truncate_torn_tail(path: str | os.PathLike[str]) -> None:
    """Cut a partial last line (left by a killed writer) so appends start on a fresh line."""
    source = Path(path)
    if source.is_symlink():
        raise OutputError(
            f"{source} is a symbolic link; posdebias writes only its own files in a run "
            "directory: remove the link or choose another --out"
        )
    if not source.is_file():  # missing, or a device/pipe the caller chose: nothing to mend
        return
    try:
        fd = os.open(source, os.O_RDWR | _NOFOLLOW)
    except OSError as exc:
        raise _output_error(source, exc) from exc
    with open(fd, "r+b") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


def open_log(path: str | os.PathLike[str]) -> JsonlAppender:
    """The run log at ``path`` opened for appending, a killed writer's torn last line cut."""
    truncate_torn_tail(path)
    return JsonlAppender(path)
