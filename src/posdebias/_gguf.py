"""A GGUF file's header read and checked in one pass, without its tensor data.

posdebias needs two things from a GGUF file before transformers loads it: the architecture
(to refuse one transformers cannot load) and the assurance that the file is whole (a truncated
download must be a clear error, not a traceback deep in a loader). Both come from the header:
the key-value section, the tensor table and the tensor sizes it implies. The header is walked
with ``struct`` over a memory map, skipping values it does not need, so a 262k-token vocabulary
costs a fraction of a second (the ``gguf`` package's reader builds an object per value: about 20
seconds for Gemma 3's). Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from posdebias._inputs import excerpt

GGUF_MAGIC = b"GGUF"
#: the versions whose counts are 64-bit (version 1 is from 2023 and no longer written)
GGUF_VERSIONS = (2, 3)
#: byte width of each fixed-size value type (uint8 ... float64; 7 is bool)
_FIXED_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_UINT32, _STRING, _ARRAY = 4, 8, 9
#: ggml stores at most four dimensions per tensor
_MAX_DIMS = 4
_DEFAULT_ALIGNMENT = 32


class GGUFDamaged(ValueError):
    """The file is not a whole GGUF file (the message says where it breaks)."""


@dataclass(frozen=True)
class GGUFHeader:
    """What posdebias reads from a GGUF file before loading it."""

    version: int
    architecture: str
    tensor_count: int
    #: the smallest size the file must have to hold every tensor its table lists
    required_size: int


class _Cursor:
    """A read position in the mapped file; every read past its end is :class:`GGUFDamaged`."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def take(self, count: int, what: str) -> int:
        start = self.pos
        if count < 0 or start + count > len(self.data):
            raise GGUFDamaged(f"it ends inside {what} (byte {start} of {len(self.data)})")
        self.pos = start + count
        return start

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, start)

    def text(self, what: str) -> str:
        """A string of the header (UTF-8 by the format; transformers decodes it strictly)."""
        (length,) = self.unpack("<Q", what)
        start = self.take(length, what)
        try:
            return self.data[start : start + length].decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFDamaged(f"{what} is not UTF-8 text") from None

    def skip_value(self, kind: int, what: str) -> None:
        if kind in _FIXED_WIDTH:
            self.take(_FIXED_WIDTH[kind], what)
        elif kind == _STRING:
            (length,) = self.unpack("<Q", what)
            self.take(length, what)
        elif kind == _ARRAY:
            item_kind, count = self.unpack("<IQ", what)
            if item_kind in _FIXED_WIDTH:
                self.take(_FIXED_WIDTH[item_kind] * count, what)
            elif item_kind == _STRING:
                for _ in range(count):
                    (length,) = self.unpack("<Q", what)
                    self.take(length, what)
            else:  # arrays of arrays are allowed by the format and written by no one
                raise GGUFDamaged(f"{what} is an array of value type {item_kind}")
        else:
            raise GGUFDamaged(f"{what} has the unknown value type {kind}")


def read_gguf_header(path: Path, block_sizes: Mapping[int, tuple[int, int]]) -> GGUFHeader:
    """The header of the GGUF file at ``path``, checked from its magic bytes to the end of the
    last tensor (:class:`GGUFDamaged` says where it breaks). ``block_sizes``: for each ggml type,
    ``(values per block, bytes per block)`` (the ``gguf`` package's ``GGML_QUANT_SIZES``)."""
    if path.stat().st_size < len(GGUF_MAGIC):
        raise GGUFDamaged("it is shorter than the GGUF magic bytes")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if data[:4] != GGUF_MAGIC:
            raise GGUFDamaged("it does not start with the GGUF magic bytes")
        cursor.take(4, "the magic bytes")
        (version,) = cursor.unpack("<I", "the version")
        if version not in GGUF_VERSIONS:
            raise GGUFDamaged(f"its version is {version}; versions {GGUF_VERSIONS} are read")
        tensor_count, key_count = cursor.unpack("<QQ", "the counts")
        architecture: str | None = None
        alignment = _DEFAULT_ALIGNMENT
        for index in range(key_count):
            key = cursor.text(f"key {index + 1} of {key_count}")
            label = f"key {excerpt(key)}"  # the file's text, escaped and cut for messages
            (kind,) = cursor.unpack("<I", f"the type of {label}")
            if key == "general.architecture" and kind == _STRING:
                architecture = cursor.text(label)
            elif key == "general.alignment":  # transformers takes it whatever its type
                if kind != _UINT32:
                    raise GGUFDamaged(f"{label} has value type {kind}, not uint32 ({_UINT32})")
                (alignment,) = cursor.unpack("<I", label)
                if alignment == 0 or alignment & (alignment - 1):
                    raise GGUFDamaged(f"{label} is {alignment}, not a power of two")
            else:
                cursor.skip_value(kind, label)
        if architecture is None:
            raise GGUFDamaged("it has no general.architecture")
        end = 0
        for index in range(tensor_count):
            label = f"tensor {excerpt(cursor.text(f'tensor {index + 1} of {tensor_count}'))}"
            (dims,) = cursor.unpack("<I", label)
            if not 1 <= dims <= _MAX_DIMS:
                raise GGUFDamaged(f"{label} has {dims} dimensions")
            shape = cursor.unpack(f"<{dims}Q", label)  # the row (blocks are cut along it) first
            ggml_type, offset = cursor.unpack("<IQ", label)
            if ggml_type not in block_sizes:
                raise GGUFDamaged(f"{label} has the unknown ggml type {ggml_type}")
            per_block, block_bytes = block_sizes[ggml_type]
            if shape[0] % per_block:
                raise GGUFDamaged(
                    f"{label} has rows of {shape[0]} values, not whole blocks of {per_block}"
                )
            end = max(end, offset + math.prod(shape) // per_block * block_bytes)
        if tensor_count == 0:  # no data section: the header is the whole file
            return GGUFHeader(version, architecture, 0, cursor.pos)
        data_start = -(-cursor.pos // alignment) * alignment
        if data_start + end > len(data):
            raise GGUFDamaged(
                f"its tensors need {data_start + end} bytes and the file has {len(data)} "
                "(truncated)"
            )
        return GGUFHeader(version, architecture, tensor_count, data_start + end)
