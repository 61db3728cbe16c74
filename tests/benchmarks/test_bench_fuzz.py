"""Fuzzing the benchmark loader: malformed lines raise BenchmarkError, never anything else."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import build_from_options as build
from posdebias.benchmarks.files import BENCHMARK_FILE, load_benchmark
from posdebias.errors import PosdebiasError

values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 30),
        st.floats(allow_nan=True),
        st.text(max_size=10),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)
fields = st.sampled_from(
    [
        "id",
        "query",
        "images",
        "target",
        "anchor_image_id",
        "setting",
        "caption_index",
        "similarities",
        "extra",
    ]
)


@pytest.fixture(scope="module")
def built(shapes_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "bench"
    build("coco", shapes_root, out, setting="random", n=3, count=4, seed=0)
    return out


def _load_variant(built: Path, text: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "bench"
        shutil.copytree(built, copy)
        (copy / BENCHMARK_FILE).write_bytes(text)
        try:
            load_benchmark(copy)
        except PosdebiasError as exc:
            assert str(exc)


@given(changes=st.dictionaries(fields, values, max_size=4), line=st.integers(0, 3))
def test_mutated_lines_raise_only_benchmark_errors(built, changes, line):
    records = [json.loads(x) for x in (built / BENCHMARK_FILE).read_text().splitlines()]
    records[line].update(changes)
    _load_variant(built, "".join(json.dumps(r) + "\n" for r in records).encode())


@given(data=st.binary(max_size=300))
def test_random_bytes_raise_only_benchmark_errors(built, data):
    _load_variant(built, data)
