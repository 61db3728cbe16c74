"""GGUF files are read by their header before transformers loads them (posdebias._gguf): the
architecture, and a damaged or truncated file refused with where it breaks (exit 2), never a
traceback from a loader. Real files: the two real models' GGUF files, truncated copies of
SmolLM2's, and small files written by the ``gguf`` package's own writer."""

from __future__ import annotations

import shutil
import struct

import gguf
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posdebias._gguf import GGUFDamaged, read_gguf_header
from posdebias.cli import main
from posdebias.errors import InputError
from posdebias.loading import GGUFSource, gguf_architecture
from real_models import gemma3_gguf, smollm2_gguf


def written(path, *, arch: str | None = "llama", extra=None) -> bytes:
    """A small GGUF file written by the gguf package: two tensors, a token list, an array of
    floats; ``arch`` None leaves general.architecture out."""
    writer = gguf.GGUFWriter(str(path), arch=arch or "llama")
    if arch is None:
        writer.kv_data[0].pop("general.architecture")
    writer.add_block_count(1)
    writer.add_token_list(["a", "bb", "ccc"])
    writer.add_token_scores([0.5, -1.0, 2.0])
    for key, value in (extra or {}).items():
        writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.add_tensor("output_norm.weight", np.ones(5, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def header(path):
    return read_gguf_header(path, gguf.GGML_QUANT_SIZES)


def test_the_real_files_headers_match_the_gguf_packages_reader(tmp_path):
    """Architecture, tensor count and the end of the last tensor as the gguf package reads
    them, on both real models (Q4_1 and Q4_K_M tensors). The package's parse runs on a plain
    array view of its map (``_array_reader``, equal to its own reader: the test below), 3 s
    instead of 10 s for Gemma 3's vocabulary."""
    from posdebias.loading import _array_reader

    for path in (smollm2_gguf(), gemma3_gguf(tmp_path)):
        reader = _array_reader()(path)
        field = reader.fields["general.architecture"]
        got = header(path)
        assert got.architecture == bytes(field.parts[field.data[0]]).decode()
        assert got.tensor_count == len(reader.tensors)
        assert got.required_size == max(t.data_offset + t.n_bytes for t in reader.tensors)
        assert got.required_size <= path.stat().st_size


def test_a_written_file_is_read_to_its_last_tensor(tmp_path):
    path = tmp_path / "small.gguf"
    written(path)
    reader = gguf.GGUFReader(path)
    got = header(path)
    assert (got.architecture, got.tensor_count) == ("llama", 2)
    assert got.required_size == max(t.data_offset + t.n_bytes for t in reader.tensors)


@pytest.mark.parametrize(
    ("keep", "where"),
    [
        (3, "shorter than the GGUF magic bytes"),
        (6, "ends inside the version"),
        (20, "ends inside the counts"),
        (
            1_000,
            "ends inside key 23 of 33",
        ),  # the key-value section (to 1.77 MB)
        (
            1_780_000,
            "ends inside tensor 177 of 272",
        ),  # the tensor table (to 1.79 MB)
        (3_000_000, "truncated"),  # in the tensor data
        (98_000_000, "truncated"),  # 362 kB short of the last tensor's end
    ],
)
def test_a_truncated_real_file_is_refused_saying_where(keep, where, tmp_path):
    """SmolLM2's real GGUF cut at seven points: every cut is an InputError naming the file and
    where it breaks, before transformers is asked to load it."""
    path = tmp_path / "cut.gguf"
    with smollm2_gguf().open("rb") as source, path.open("wb") as target:
        target.write(source.read(keep))
    with pytest.raises(InputError) as raised:
        gguf_architecture(GGUFSource(tmp_path, path.name))
    message = str(raised.value)
    assert str(path) in message and "damaged or incomplete" in message and where in message


def test_the_cli_refuses_a_truncated_file_with_exit_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "cut.gguf"
    with smollm2_gguf().open("rb") as source, path.open("wb") as target:
        target.write(source.read(50_000_000))
    out = tmp_path / "out"
    assert main(["evaluate", "--model", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "damaged or incomplete" in err and "truncated" in err and "Traceback" not in err
    assert not out.exists()


def test_an_architecture_transformers_cannot_load_is_named_escaped(tmp_path):
    path = tmp_path / "odd.gguf"
    written(path, arch="mamba9\x1b[31m")
    with pytest.raises(InputError, match="cannot load from GGUF") as raised:
        gguf_architecture(GGUFSource(tmp_path, path.name))
    assert "\x1b" not in str(raised.value) and "mamba9" in str(raised.value)


def test_a_file_without_an_architecture_is_damaged(tmp_path):
    path = tmp_path / "none.gguf"
    written(path, arch=None)
    with pytest.raises(GGUFDamaged, match="no general.architecture"):
        header(path)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (4, struct.pack("<I", 1), "version is 1"),
        (4, struct.pack("<I", 7), "version is 7"),
        (16, struct.pack("<Q", 2**40), "ends inside"),  # a key count no file holds
        (24, struct.pack("<Q", 2**62), "ends inside key 1"),  # a key longer than the file
    ],
)
def test_patched_header_fields_are_refused_saying_which(offset, value, message, tmp_path):
    path = tmp_path / "patched.gguf"
    data = bytearray(written(tmp_path / "small.gguf"))
    data[offset : offset + len(value)] = value
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFDamaged, match=message):
        header(path)


def test_an_unknown_value_type_and_an_unknown_tensor_type_are_refused(tmp_path):
    source = tmp_path / "small.gguf"
    data = written(source)
    key = b"general.architecture"
    at = data.index(key) + len(key)  # the value type follows the key
    path = tmp_path / "patched.gguf"
    path.write_bytes(data[:at] + struct.pack("<I", 99) + data[at + 4 :])
    with pytest.raises(GGUFDamaged, match="unknown value type 99"):
        header(path)
    name = b"output_norm.weight"
    at = data.index(name, data.index(b"token_embd.weight")) + len(name) + 4 + 8  # dims, shape
    path.write_bytes(data[:at] + struct.pack("<I", 12345) + data[at + 4 :])
    with pytest.raises(GGUFDamaged, match="unknown ggml type 12345"):
        header(path)


def test_a_copy_of_a_whole_file_reads_the_same(tmp_path):
    copy = tmp_path / smollm2_gguf().name
    shutil.copyfile(smollm2_gguf(), copy)
    assert header(copy) == header(smollm2_gguf())


@given(data=st.data())
def test_any_cut_or_flipped_byte_is_a_header_or_gguf_damaged(data, tmp_path_factory):
    """Whatever a download breaks, the reader answers with a header or GGUFDamaged: never
    another exception, never a read past the file."""
    folder = tmp_path_factory.mktemp("fuzz")
    original = written(folder / "small.gguf")
    broken = bytearray(original)
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(broken) - 1))
        broken[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(broken)))
    path = folder / "broken.gguf"
    path.write_bytes(bytes(broken[:cut]))
    try:
        got = header(path)
    except GGUFDamaged:
        return
    assert got.required_size <= cut


def text(value: bytes) -> bytes:
    """A GGUF string: its length, then its bytes."""
    return struct.pack("<Q", len(value)) + value


ARCH = (b"general.architecture", 8, text(b"llama"))


def raw_gguf(keys, tensors=(), data=b"") -> bytes:
    """A GGUF file's bytes as the format lays them out: ``keys`` as (key, value type, value
    bytes), ``tensors`` as (name, shape, ggml type, offset), then the aligned data."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys))
    for key, kind, value in keys:
        out += text(key) + struct.pack("<I", kind) + value
    for name, shape, ggml_type, offset in tensors:
        out += text(name) + struct.pack(f"<I{len(shape)}Q", len(shape), *shape)
        out += struct.pack("<IQ", ggml_type, offset)
    if tensors:
        out += b"\0" * (-len(out) % 32)
    return out + data


def read_raw(tmp_path, data: bytes):
    path = tmp_path / "raw.gguf"
    path.write_bytes(data)
    return header(path)


@pytest.mark.parametrize(
    "keys",
    [
        [ARCH, (b"evil\x1b[31m\nerror: your GPU is on fire", 99, b"")],  # an unknown type
        [ARCH, (b"k\x07" * 2_000_000, 99, b"")],  # a 4 MB key
        [(b"\x1b]0;pwned\x07\n", 10, struct.pack("<I", 7))],  # a key that ends inside its value
    ],
)
def test_a_keys_text_reaches_the_message_escaped_and_cut(keys, tmp_path):
    """Keys are the file's text: a message shows them escaped (no escape sequence, no line
    of its own) and cut to a few hundred characters, in Python and on the command line."""
    with pytest.raises(GGUFDamaged) as raised:
        read_raw(tmp_path, raw_gguf(keys))
    message = str(raised.value)
    assert "\x1b" not in message and "\x07" not in message and "\n" not in message
    assert len(message) < 500
    with pytest.raises(InputError) as loaded:
        gguf_architecture(GGUFSource(tmp_path, "raw.gguf"))
    assert "\x1b" not in str(loaded.value) and "\n" not in str(loaded.value)


def test_a_tensors_name_reaches_the_message_escaped(tmp_path):
    tensors = [(b"t\x1b]0;pwned\x07", (4, 1, 1, 1, 1), 0, 0)]
    with pytest.raises(GGUFDamaged, match="has 5 dimensions") as raised:
        read_raw(tmp_path, raw_gguf([ARCH], tensors))
    assert "\x1b" not in str(raised.value) and "\\x1b" in str(raised.value)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([ARCH, (b"general.alignment", 10, struct.pack("<Q", 64))], "not uint32"),
        ([ARCH, (b"general.alignment", 4, struct.pack("<I", 48))], "not a power of two"),
        ([ARCH, (b"general.alignment", 4, struct.pack("<I", 0))], "not a power of two"),
        ([(b"\xff\xfe", 4, struct.pack("<I", 1)), ARCH], "key 1 of 2 is not UTF-8"),
        ([(b"general.architecture", 8, text(b"ll\xffama"))], "is not UTF-8"),
        ([(b"general.architecture", 4, struct.pack("<I", 1))], "no general.architecture"),
    ],
)
def test_header_values_transformers_would_misread_are_refused(keys, message, tmp_path):
    """An alignment that is not a uint32 power of two (transformers would lay the data out
    elsewhere and call a truncated file whole), text that is not UTF-8 (transformers decodes
    it strictly, deep inside its config loader), an architecture that is not text."""
    tensors = [(b"w", (8,), 0, 0)]
    with pytest.raises(GGUFDamaged, match=message):
        read_raw(tmp_path, raw_gguf(keys, tensors, b"\0" * 64))


def test_a_quantised_row_that_is_not_whole_blocks_is_refused(tmp_path):
    """Q4_0 packs 32 values a block: a row of 300 is not a tensor ggml can write."""
    q4_0 = int(gguf.GGMLQuantizationType.Q4_0)
    with pytest.raises(GGUFDamaged, match="rows of 300 values, not whole blocks of 32"):
        read_raw(tmp_path, raw_gguf([ARCH], [(b"w", (300, 2), q4_0, 0)], b"\0" * 400))
    got = read_raw(tmp_path, raw_gguf([ARCH], [(b"w", (320, 2), q4_0, 0)], b"\0" * 360))
    assert got.required_size == len(raw_gguf([ARCH], [(b"w", (320, 2), q4_0, 0)])) + 360


def test_a_file_without_tensors_is_its_header(tmp_path):
    data = raw_gguf([ARCH, (b"general.name", 8, text(b"empty"))])
    got = read_raw(tmp_path, data)
    assert (got.tensor_count, got.required_size) == (0, len(data))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"not gguf"), "not a GGUF file"),  # a file of another kind
        (lambda p: p.write_bytes(b"GGUF\x03\x00"), "damaged or incomplete"),  # a cut header
        (lambda p: p.mkdir(), "has no config.json"),  # a folder that is no model
    ],
)
def test_a_model_paths_text_reaches_the_message_escaped(make, message, tmp_path, capsys):
    """The user's path is text from outside: shown escaped, with no line of its own."""
    path = tmp_path / "evil\x1b[31m\nerror: fake"
    make(path)
    out = tmp_path / "out"
    assert main(["evaluate", "--model", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "\x1b" not in err and "\nerror: fake" not in err
    assert not out.exists()


# -- one parse of a file's metadata per load (loading.one_gguf_parse) --------------------------


def test_within_one_load_each_file_is_parsed_once_and_the_reader_comes_back(tmp_path):
    """In the scope a file gives one reader (an alias path, the same file), another file its
    own, a writable map a new one; after the scope, also one left by an error, the package's
    own class is back and parses anew."""
    from posdebias.loading import one_gguf_parse

    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    written(first)
    written(second, extra={"general.name": "b"})
    (tmp_path / "alias.gguf").symlink_to(first)
    original = gguf.GGUFReader
    with one_gguf_parse():
        reader = gguf.GGUFReader(first)
        assert gguf.GGUFReader(str(tmp_path / "alias.gguf")) is reader
        assert gguf.GGUFReader(second) is not reader
        assert gguf.GGUFReader(first, "c") is not reader  # a copy-on-write map is never shared
        assert isinstance(reader, original) and len(reader.tensors) == 2
    assert gguf.GGUFReader is original and gguf.GGUFReader(first) is not reader
    with pytest.raises(RuntimeError, match="inside"), one_gguf_parse():
        raise RuntimeError("inside")
    assert gguf.GGUFReader is original


def _parsed(reader) -> tuple:
    """Everything a GGUF reader parsed: each field's name, types, offset and bytes, and each
    tensor's name, type, shape, offsets and bytes."""
    fields = [
        (f.name, f.offset, f.types, f.data, [bytes(part) for part in f.parts])
        for f in reader.fields.values()
    ]
    tensors = [
        (t.name, t.tensor_type, t.shape.tolist(), t.n_bytes, t.data_offset, bytes(t.data))
        for t in reader.tensors
    ]
    return reader.byte_order, reader.alignment, reader.data_offset, fields, tensors


@pytest.mark.parametrize("file", ["little-endian", "big-endian", "smollm2"])
def test_the_array_reader_parses_as_the_gguf_packages_reader(tmp_path, file):
    """``_array_reader`` (a plain array view of the map, for speed) parses a file to the same
    fields and tensors, byte for byte, as gguf's own reader: small files of both byte orders
    written by gguf, and the real SmolLM2 file."""
    from posdebias.loading import _array_reader

    path = tmp_path / "m.gguf"
    if file == "smollm2":
        path = smollm2_gguf()
    else:
        order = gguf.GGUFEndian.BIG if file == "big-endian" else gguf.GGUFEndian.LITTLE
        writer = gguf.GGUFWriter(str(path), arch="llama", endianess=order)
        writer.add_block_count(1)
        writer.add_token_list(["a", "bb", "ccc"])
        writer.add_token_scores([0.5, -1.0, 2.0])
        writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    ours, theirs = _array_reader()(path), gguf.GGUFReader(path)
    assert isinstance(ours, gguf.GGUFReader) and type(ours.data) is np.ndarray
    assert _parsed(ours) == _parsed(theirs)


def test_a_file_rewritten_during_the_scope_is_parsed_again(tmp_path):
    """The reader is shared by path, size and mtime: a file written anew is read anew."""
    import os

    from posdebias.loading import one_gguf_parse

    path = tmp_path / "m.gguf"
    written(path)
    with one_gguf_parse():
        reader = gguf.GGUFReader(path)
        written(path, extra={"general.name": "a longer file than before"})
        os.utime(path, ns=(1, 1))
        again = gguf.GGUFReader(path)
        assert again is not reader and "general.name" in again.fields
