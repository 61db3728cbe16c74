"""Reading what a user hands us, safely: regular files of bounded size, confined paths, JSON Lines
split on ``\\n`` only, JSON and YAML that cannot explode, and bounded excerpts for messages.

Every reader of user files goes through here so the same rules hold everywhere (docs/errors.md,
"Security"): a FIFO, a device or a directory is refused instead of read (``/dev/zero`` would read
forever, a FIFO would hang), a file over its size limit is refused with the limit in the message,
a path named *inside* an input file must stay inside the folder it belongs to (symlinks
resolved), and an error message quotes at most :data:`EXCERPT_CHARS` characters of the input.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Strict

import posdebias.defaults as defaults
from posdebias.errors import ConfigError, InputError

MiB = 1 << 20
#: Size limits of the files we read (bytes). Configs, prompts and manifests are small; a
#: calibration state holds a few arrays; benchmark and annotation files can be large (COCO's
#: train instances file is 450 MB).
CONFIG_LIMIT = 1 * MiB
STATE_LIMIT = 64 * MiB
DATA_LIMIT = 2048 * MiB
IMAGE_FILE_LIMIT = 256 * MiB
#: How much of an offending input value an error message quotes.
EXCERPT_CHARS = 80
#: Largest YAML document after alias expansion, in nodes (a config has a few dozen).
YAML_MAX_NODES = 10_000


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr`` of ``value`` cut to about ``limit`` characters, saying how long it really was."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ (or a huge structure) must not break a message
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


def read_input_bytes(
    path: str | os.PathLike[str],
    what: str,
    *,
    limit: int,
    error: type[InputError] = InputError,
    hint: str = "",
    follow_links: bool = True,
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or ``error`` saying why not.

    Opened non-blocking, so a FIFO is refused instead of waited on; ``/dev/zero`` and other
    devices, directories and sockets are refused before anything is read. Without
    ``follow_links`` a symbolic link is refused too (files of a run directory are our own).
    """
    problem = path_problem(path)
    if problem is not None:
        raise error(f"{what}: {problem}")
    source = Path(path)
    suffix = f"; {hint}" if hint else ""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(source, flags)
    except FileNotFoundError:
        raise error(f"{what} {source} does not exist{suffix}") from None
    except IsADirectoryError:
        raise error(f"{what} {source} is a directory, not a file{suffix}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise error(
                f"{what} {source} is a symbolic link; posdebias reads and writes only its own "
                "files in a run directory, never through links"
            ) from None
        if exc.errno == errno.ENAMETOOLONG:
            raise error(f"{what} {excerpt(str(source))}: the name is too long") from None
        raise error(f"cannot read {what} {source}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {source} is a directory, not a file{suffix}")
        if not stat.S_ISREG(info.st_mode):
            raise error(
                f"{what} {source} is not a regular file (a device, pipe or socket); posdebias "
                "reads only regular files"
            )
        if info.st_size > limit:
            raise error(
                f"{what} {source} is {_size(info.st_size)}, over the limit of {_size(limit)} "
                f"for a {what}; is it the right file?"
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {source}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while we read it
        raise error(f"{what} {source} is over the limit of {_size(limit)} for a {what}")
    return data


def read_input_text(
    path: str | os.PathLike[str],
    what: str,
    *,
    limit: int,
    error: type[InputError] = InputError,
    hint: str = "",
) -> str:
    """:func:`read_input_bytes` decoded as UTF-8 (a leading byte-order mark is dropped)."""
    data = read_input_bytes(path, what, limit=limit, error=error, hint=hint)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_whole_number(
    what: str, value: Any, low: int, high: int, *, error: type[InputError] = InputError
) -> int:
    """``value`` if it is a whole number from ``low`` to ``high``; else ``error`` naming
    ``what`` (a flag, an option) and the range. The one check of a number that reaches no
    pydantic model (``--threads``, ``--rotations``, ...)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{what} must be a whole number from {low:,} to {high:,}, got {excerpt(value)}")
    return value


#: The most digits a whole number written in an input file may have: ids, counts, answers and
#: turns need far fewer, and ``int()`` of a long digit string is slow or refused (4,300 digits).
MAX_NUMBER_DIGITS = 18
#: The largest magnitude of a decimal number read from an input file (a relevance score, a
#: fitted log-probability): far beyond every real value, and small enough that sums, products
#: and differences of such numbers stay finite in float64.
MAX_FILE_MAGNITUDE = 1e12
_DIGITS = re.compile(rf"[0-9]{{1,{MAX_NUMBER_DIGITS}}}")
_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?"
)


def file_whole_number(value: Any, field: str, low: int, high: int, *, text: bool = True) -> int:
    """``value`` of the input-file field ``field`` as a whole number from ``low`` to ``high``.

    The one reader of a whole number written in a data file: a JSON integer (not ``true``, not
    ``2.0``) or, where ``text`` allows, a text of ASCII digits only (``"3"``, not ``"\u00b2"``
    or ``"\u0663"``), at most :data:`MAX_NUMBER_DIGITS` digits. Anything else is an
    :class:`InputError` naming the field and the value; callers add the file and the line.
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 10**MAX_NUMBER_DIGITS:
            number = value
    elif text and isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    if number is None:
        written = "digits only, " if text else ""
        raise InputError(
            f"{field} {excerpt(value)} is not a whole number ({written}at most "
            f"{MAX_NUMBER_DIGITS} digits, no decimal point)"
        )
    if not low <= number <= high:
        raise InputError(f"{field} {excerpt(value)} is out of range ({low:,} to {high:,})")
    return number


def file_decimal_number(
    value: Any, field: str, low: float = -MAX_FILE_MAGNITUDE, high: float = MAX_FILE_MAGNITUDE
) -> float:
    """``value`` of the input-file field ``field`` as a finite number from ``low`` to ``high``:
    a JSON number (not a boolean) or a plain decimal text (``2``, ``0.5``, ``1e-3``; not
    ``nan``, ``inf``, ``1_000`` or ``\u00b2``). Else an :class:`InputError` naming the field."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an integer beyond any float
            number = float(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        number = float(value.strip())
    if number is None or not math.isfinite(number):
        raise InputError(f"{field} {excerpt(value)} is not a finite number")
    if not low <= number <= high:
        raise InputError(f"{field} {excerpt(value)} is out of range ({low:g} to {high:g})")
    return number


def text_problem(text: str) -> str | None:
    """Why ``text`` (a field of an input file) cannot be used, or None: a lone surrogate such
    as U+D800 (which JSON's ``\\ud800`` escape yields) is half of a pair, no character; no
    file can store it as UTF-8 and no tokenizer can encode it. The one text check of every
    field of every source, before anything is written or tokenized."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        return (
            f"holds U+{code:04X}, half of a surrogate pair, which is no character and no file "
            "or tokenizer can encode; fix the text's encoding"
        )
    return None


def check_setting(name: str, value: Any) -> int:
    """``value`` if it is a whole number in the range of the run setting ``name``
    (:data:`posdebias.defaults.RANGES`: ``batch_size``, ``seed``, ``orders``, ``count``,
    ``calibration_count``), the range a config file and the command line hold it to; else an
    InputError. The Python API checks its arguments with it, so both refuse the same values."""
    low, high = defaults.RANGES[name]
    return check_whole_number(name, value, low, high)


#: What a file system takes: a file or folder name of at most 255 bytes, a path of at most 4095.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


def path_name_problem(name: str | os.PathLike[str]) -> str | None:
    """Why no file system can hold a file of this name (None if one can): a NUL character, a
    part over :data:`NAME_MAX_BYTES` or a whole over :data:`PATH_MAX_BYTES` bytes.

    Checked before the name reaches the operating system, whose answer (``ENAMETOOLONG``) the
    path predicates (``Path.is_file``) raise instead of answering False.
    """
    text = os.fspath(name)
    if "\x00" in text:
        return "contains a NUL character"
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        return "is not a usable file name (it holds characters no file name can)"
    if len(encoded) > PATH_MAX_BYTES:
        return f"is too long ({len(encoded)} bytes; a path has at most {PATH_MAX_BYTES})"
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX_BYTES:
        return (
            f"is too long (a part of {longest} bytes; a file or folder name has at most "
            f"{NAME_MAX_BYTES})"
        )
    return None


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` names no usable file or folder (None if it does), the rule of every door:
    empty (``Path("")`` is the current folder), no file system can hold it, or a ``~`` no
    home folder is known for."""
    text = os.fspath(path)
    if not text.strip():
        return "an empty path: name a file or folder"
    problem = path_name_problem(text)
    if problem is None and text.startswith("~") and os.path.expanduser(text).startswith("~"):
        problem = "starts with ~, but no home folder is known for it (an unknown user, no HOME)"
    return None if problem is None else f"the path {excerpt(text)} {problem}"


def _usable_path(value: Any) -> Any:
    if not isinstance(value, str | os.PathLike):
        return value  # the field's type refuses it
    problem = path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return os.path.expanduser(value)  # ~ is the home folder at every door, as in a shell


def usable_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` checked as a config file's (:func:`path_problem`, ``~`` expanded), or
    InputError naming ``what``."""
    try:
        return Path(_usable_path(path))
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None


#: A path or a model id in a config file: refused by validation when no file system could
#: hold it, so that no later ``Path.is_file`` meets ``ENAMETOOLONG``. A path is written as text,
#: also where the rest of a model reads its values strictly (as written: ``true`` is no 1).
UsablePath = Annotated[Path, Strict(False), BeforeValidator(_usable_path)]
UsableName = Annotated[str, BeforeValidator(_usable_path)]


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int, int] | None:
    """(device, inode, size, mtime and ctime in ns) of a regular file, None for anything else:
    the same through every path that reaches the file (an alias, a link, a moved folder) and
    new when the file is rewritten, also by a copy that restores the old mtime (``cp -p``,
    ``rsync -t``: the ctime still moves). What the memos of a file's content are keyed by."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def check_regular_file(
    path: str | os.PathLike[str], what: str, *, limit: int, error: type[InputError]
) -> None:
    """Refuse ``path`` unless it is a usable path (:func:`path_problem`) of a regular file of
    at most ``limit`` bytes (for files that a library opens itself, such as images)."""
    problem, shown = path_problem(path), repr(os.fspath(path))  # whole, quoted, escaped
    if problem is not None:
        raise error(f"{what}: {problem}")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {shown} does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {what} {shown}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what} {shown} is not a regular file; posdebias reads only regular files")
    if info.st_size > limit:
        raise error(f"{what} {shown} is {_size(info.st_size)}, over the limit of {_size(limit)}")


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split on ``\\n`` only (a ``\\r`` before it is dropped).

    ``str.splitlines`` also splits on U+2028, U+0085 and other characters that are valid, raw,
    inside JSON strings, which breaks a valid file apart.
    """
    return [line.removesuffix("\r") for line in text.split("\n")]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no number JSON allows")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:EXCERPT_CHARS]} is too large to be finite")
    return number


def loads_json(text: str | bytes) -> Any:
    """``json.loads`` that refuses what JSON does not allow and Python's reader takes:
    ``NaN``, ``Infinity`` and numbers that overflow to infinity (``1e999``), with a ValueError.
    The one JSON reader of files and answers: a number read from one is always finite."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def json_failure(exc: ValueError | RecursionError) -> str:
    """Why :func:`loads_json` refused a text, in a few words (never the text itself): the
    syntax error, ``nested too deeply``, or what was wrong with a value."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)[:EXCERPT_CHARS]


def parse_json(text: str | bytes, what: str, *, error: type[InputError] = InputError) -> Any:
    """:func:`loads_json` with every failure (syntax, nesting too deep, a number too long or
    not finite) as ``error``; the message says where, not what the text was."""
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    except (RecursionError, ValueError) as exc:  # e.g. an integer of more than 4300 digits
        raise error(f"{what}: not usable JSON ({json_failure(exc)})") from None


def confined_path(
    base: Path, name: str, what: str, *, error: type[InputError] = InputError, hint: str = ""
) -> Path:
    """``base / name`` with symlinks resolved, refused unless it stays inside ``base``.

    For paths written *inside* input files (a manifest's ``benchmark_file``, an image listed in
    a benchmark): such a file cannot make posdebias read elsewhere. Paths the user types on the
    command line are not confined.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise error(f"{what} {excerpt(name)} is not a usable relative path")
    if (
        PurePosixPath(name).is_absolute()
        or PureWindowsPath(name).is_absolute()
        or PureWindowsPath(name).drive
    ):
        raise error(
            f"{what} {excerpt(name)} is an absolute path; an input file may only name paths "
            f"inside {base}{'; ' + hint if hint else ''}"
        )
    root = base.resolve()
    try:
        target = (root / name).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, an unusable name
        raise error(f"{what} {excerpt(name)} cannot be resolved ({exc})") from None
    if not target.is_relative_to(root):
        raise error(
            f"{what} {excerpt(name)} leads outside {base} (symlinks resolved); an input file may "
            f"only name paths inside the folder it belongs to{'; ' + hint if hint else ''}"
        )
    return target


# ------------------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """The safe loader, reading ``1e-3`` and ``1e9`` as numbers (YAML 1.2) where YAML 1.1 reads
    text: options are read strictly, so a number written without a dot must stay a number."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+\Z"),
    list("-+0123456789."),
)


def load_yaml(text: str, what: str, *, error: type[InputError] = ConfigError) -> Any:
    """``yaml.safe_load`` that refuses a document whose aliases expand beyond
    :data:`YAML_MAX_NODES` nodes (a "billion laughs" bomb) or that refers to itself, and reads
    a number with an exponent as a number (:class:`_Loader`)."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # the reader refuses some characters right away
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, what, error)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise error(f"{what} cannot be parsed as YAML: {_bounded(str(exc))}") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to be a configuration") from None
    finally:
        if loader is not None:
            loader.dispose()


def _bounded(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _check_expansion(root: Any, what: str, error: type[InputError]) -> None:
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise error(f"{what}: a YAML alias refers to itself; configurations cannot be cyclic")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = total
        if total > YAML_MAX_NODES:
            raise error(
                f"{what} expands to more than {YAML_MAX_NODES} YAML nodes (through aliases); a "
                "configuration is never that large: remove the repeated aliases"
            )
        return total

    size(root)
