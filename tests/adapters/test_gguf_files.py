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
    them, on both real models (Q4_1 and Q4_K_M tensors)."""
    for path in (smollm2_gguf(), gemma3_gguf(tmp_path)):
        reader = gguf.GGUFReader(path)
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
