"""One run-directory layer: every command that owns a folder reads and writes it through here.

``evaluate``, ``sweep``, ``calibrate``, ``build`` and ``organism train`` each keep a folder of
their own. The same rules hold in all of them (docs/errors.md, "Stale results"):

* a folder we did not make (non-empty, without our marker file) is refused, never written into;
* an exclusive lock is held while a process writes there (a second one is refused, with the
  holder's pid), and leftovers of a killed writer are cleared under it;
* a symbolic link where we keep a file or a subfolder is refused, for reading and writing: we
  never read a file of someone else's as ours, nor write through a link to it;
* our files are read as regular files of bounded size (non-blocking, so a FIFO cannot hang us
  and ``/dev/zero`` cannot fill memory), parsed, and validated against their schema: a malformed
  file is an exit-2 error naming it;
* files record the :data:`FORMAT_VERSION` that wrote them, and a newer one than this reader
  knows is refused instead of misread.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from posdebias._inputs import CONFIG_LIMIT, excerpt, parse_json, read_input_bytes
from posdebias._io import (
    DirectoryLock,
    atomic_write_json,
    remove_stale,
    staged_files,
    write_files_together,
)
from posdebias.errors import OutputError, ResumeError, validation_problems

#: Version of the files posdebias keeps in its run directories (run.json, sweep.json, points,
#: timing). A reader refuses a version newer than its own.
FORMAT_VERSION = 1
FORMAT_KEY = "format_version"

_TEMP = re.compile(r"^\..+\.(tmp|staging)\Z")
Model = TypeVar("Model", bound=BaseModel)


def check_format_version(payload: Any, path: Path) -> None:
    """Refuse a file written by a newer posdebias (its format may mean something else)."""
    if not isinstance(payload, dict):
        return
    version = payload.get(FORMAT_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ResumeError(
            f"{path}: format version {excerpt(version)} is not one posdebias writes; delete the "
            "folder or use a new --out"
        )
    if version > FORMAT_VERSION:
        raise ResumeError(
            f"{path} was written by a newer posdebias (format version {version}; this one reads "
            f"up to {FORMAT_VERSION}); upgrade posdebias or use a new --out"
        )


class RunFolder:
    """A folder one command owns: identified by its ``marker`` file, holding only names that
    match ``own`` (plus our lock and temporary names); ``subfolders`` are ours too. Without a
    marker (a folder of calibration states) a folder is ours when everything in it is a
    regular file named as ours, or one of our subfolders.

    ``flag`` is the option that named the folder, for messages (``--out``, ``--root``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        marker: str | None,
        own: re.Pattern[str],
        subfolders: Iterable[str] = (),
        flag: str = "--out",
        kind: str = "posdebias run directory",
    ) -> None:
        self.root = Path(root)
        self.marker = marker
        self.own = own
        self.subfolders = tuple(subfolders)
        self.flag = flag
        self.kind = kind
        self._lock = DirectoryLock(self.root)

    # -- ownership --------------------------------------------------------------------------

    def is_ours(self) -> bool:
        """Whether the folder holds our marker as a regular file (not a link)."""
        if self.marker is None:
            return False  # judged by its entries (see check)
        try:
            info = os.lstat(self.root / self.marker)
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode)

    def check(self) -> None:
        """Refuse a folder we did not make, and links where we keep our files."""
        try:
            info = os.stat(self.root)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._cannot_create(exc) from None
        if not stat.S_ISDIR(info.st_mode):
            raise OutputError(
                f"{self.flag} {self.root} is a file; give a folder (a new one, or one of ours)"
            )
        try:
            entries = sorted(self.root.iterdir())
        except OSError as exc:  # an unreadable folder: permission denied
            raise self._cannot_read(exc) from None
        links = [e.name for e in entries if e.is_symlink() and self._ours(e.name)]
        for sub in self.subfolders:
            folder = self.root / sub
            if folder.is_dir() and not folder.is_symlink():
                try:
                    inside = sorted(folder.iterdir())
                except OSError as exc:
                    raise self._cannot_read(exc) from None
                links += [f"{sub}/{e.name}" for e in inside if e.is_symlink()]
        if links:
            raise OutputError(
                f"{self.flag} {self.root} holds symbolic links where posdebias keeps its own "
                f"files ({', '.join(links[:5])}); posdebias does not read or write through "
                f"links: remove them or choose another {self.flag}"
            )
        if self.is_ours():
            return
        marker = None if self.marker is None else self.root / self.marker
        if marker is not None and os.path.lexists(marker):
            raise OutputError(
                f"{marker} is not a regular file (a pipe, device or folder); posdebias keeps "
                f"only its own files there: remove it or choose another {self.flag}"
            )
        foreign = [
            e.name
            for e in entries
            if not (e.name == DirectoryLock.FILE or _TEMP.fullmatch(e.name))
            and not (marker is None and self._ours_by_kind(e))
        ]
        if foreign:
            shown = ", ".join(excerpt(name, 40) for name in foreign[:5])
            shown += ", ..." if len(foreign) > 5 else ""
            raise OutputError(
                f"{self.flag} {self.root} is not empty and is not a {self.kind} (it holds "
                f"{shown}); posdebias writes only into a new or empty folder or one of its own: "
                f"choose another {self.flag}"
            )

    def _ours_by_kind(self, entry: Path) -> bool:
        """Whether ``entry`` is ours in a folder without a marker: a regular file named as ours,
        or one of our subfolders (links are refused before this is asked)."""
        if entry.name in self.subfolders:
            return entry.is_dir()
        return bool(self.own.fullmatch(entry.name)) and entry.is_file()

    def _ours(self, name: str) -> bool:
        return name == self.marker or name in self.subfolders or bool(self.own.fullmatch(name))

    def create(self) -> None:
        """Make the folder (and its subfolders) if needed."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._cannot_create(exc) from None

    def _cannot_read(self, exc: OSError) -> OutputError:
        return OutputError(
            f"cannot read {self.flag} {self.root}: {exc.strerror or exc}; give a folder "
            f"posdebias may read and write, or choose another {self.flag}"
        )

    def _cannot_create(self, exc: OSError) -> OutputError:
        """Why the folder cannot be made, naming a file that stands where a folder must be."""
        blocking = next((p for p in self.root.parents if p.is_file()), None)
        why = f"{blocking} is a file, not a folder" if blocking else exc.strerror or str(exc)
        return OutputError(f"cannot create output directory {self.root}: {why}")

    def lock(self) -> None:
        """Take the folder's exclusive lock and clear what a killed writer left behind."""
        self._lock.acquire()
        for folder in (self.root, *(self.root / sub for sub in self.subfolders)):
            if folder.is_dir() and not folder.is_symlink():
                remove_stale(folder)

    def unlock(self, *, remove: bool = False) -> None:
        """Release the lock; ``remove`` also deletes the lock file, for a folder that is
        complete and never written again (a trained model folder carries no lock file)."""
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self._lock.path)
        self._lock.release()

    def staged(self) -> contextlib.AbstractContextManager[Path]:
        """A staging folder inside this one; what is written there appears here only when the
        block succeeds (see :func:`posdebias._io.staged_files`). Hold the lock meanwhile."""
        return staged_files(self.root)

    # -- files ------------------------------------------------------------------------------

    def path(self, relative: str) -> Path:
        """``root / relative``, refused where a folder on the way is a link or not a folder
        (writing there would change files outside the run directory)."""
        parts = Path(relative).parts
        if not parts or any(p in ("", ".", "..") or os.sep in p for p in parts):
            raise ValueError(f"not a relative path inside the folder: {relative!r}")
        current = self.root
        for part in parts[:-1]:
            current = current / part
            if current.is_symlink():
                raise OutputError(
                    f"{current} is a symbolic link; posdebias does not read or write through "
                    f"links: remove it or choose another {self.flag}"
                )
            if current.exists() and not current.is_dir():
                raise OutputError(
                    f"{current} is not a folder; posdebias keeps its own files there: remove "
                    f"it or choose another {self.flag}"
                )
        return self.root / relative

    def read_json(self, relative: str, what: str) -> Any | None:
        """Our JSON file ``relative`` (None when it does not exist), refused with a message
        naming it when it is a link, not a regular file, too large, not UTF-8 JSON, or of a
        newer format version."""
        path = self.path(relative)
        if not os.path.lexists(path):
            return None
        hint = f"delete it, or use a new {self.flag}"
        data = read_input_bytes(
            path, what, limit=CONFIG_LIMIT, error=ResumeError, hint=hint, follow_links=False
        )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ResumeError(
                f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); {hint}"
            ) from None
        payload = parse_json(text, f"{what} {path}", error=ResumeError)
        check_format_version(payload, path)
        return payload

    def read_model(self, relative: str, model: type[Model], what: str) -> Model | None:
        """:meth:`read_json` validated against ``model`` (every problem named)."""
        payload = self.read_json(relative, what)
        return None if payload is None else self.validate(payload, model, relative, what)

    def validate(self, payload: Any, model: type[Model], relative: str, what: str) -> Model:
        """``payload`` (read from ``relative``) as ``model``, or an error naming the file."""
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc, unknown="key")[:5])
            raise ResumeError(
                f"{what} {self.root / relative} is not one posdebias wrote ({problems}); delete "
                f"it, or use a new {self.flag}"
            ) from None

    def write_files(self, files: dict[str, bytes], *, new: bool = False) -> list[Path]:
        """Write plain files into the folder together (all or none), never through a link;
        ``new``: refuse to replace anything that stands at one of the names (a file of the
        user's, a dangling link), for folders we share with other files."""
        if not new:
            self.refuse_links(files)
        return write_files_together(self.root, files, new=new)

    def refuse_links(self, names: Iterable[str]) -> None:
        """Refuse a symbolic link (a dangling one included) at any of ``names``: a rename
        would replace the user's link, a write through it would change its target. Call it
        before anything is written, so that a refusal leaves the folder as it was."""
        for name in names:
            path = self.path(name)
            if path.is_symlink():
                raise OutputError(
                    f"{path} is a symbolic link; posdebias does not write through links: "
                    f"remove it or choose another {self.flag}"
                )

    def write_json(self, relative: str, payload: Any) -> Path:
        """Write our JSON file atomically, never through a link (a subfolder is made)."""
        path = self.path(relative)
        if path.parent != self.root:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
        self.refuse_links([relative])
        return atomic_write_json(path, payload)


class CacheFolder(RunFolder):
    """A folder of posdebias's caches (what :func:`posdebias._io.cache_root` holds: CLIP
    embeddings, the bundled text questions, harness calibrations) through the one layer: ours
    when it holds only regular files named as ours (a cache an older posdebias wrote
    included); never read or written through a link; each file written atomically (one
    rename). No lock is taken: runs that share a cache never wait on each other, and two that
    write the same file write the same bytes."""

    def __init__(
        self, root: str | os.PathLike[str], *, own: re.Pattern[str], kind: str, flag: str
    ) -> None:
        super().__init__(root, marker=None, own=own, flag=flag, kind=kind)

    def cached(self, name: str) -> Path | None:
        """The path of our file ``name`` when it is there (a regular file), else None; a
        folder we did not make, or a link at one of our names, is refused."""
        self.check()
        path = self.path(name)
        try:
            return path if path.is_file() else None
        except OSError as exc:  # a folder we may list but not enter
            raise self._cannot_read(exc) from None

    def store(self, name: str, data: bytes) -> Path:
        """Write our file ``name`` (the folder is checked and made first; leftovers of killed
        writers are cleared)."""
        if not self.own.fullmatch(name):
            raise ValueError(f"{name!r} is not a file of {self.kind}")
        self.check()
        self.create()
        try:
            remove_stale(self.root)
            return self.write_files({name: data})[0]
        except OSError as exc:  # a folder we may list but not enter
            raise self._cannot_read(exc) from None
