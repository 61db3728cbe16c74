"""Random user strings through the real CLI: labels, captions, ids, image names and output paths
full of rich markup, path separators, control and line-separator characters.

Whatever the string, the command ends with exit 0 (it worked) or 2 (a clear error), never 1
("internal error"), and writes nothing outside the run directory it was given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import build_shapes_benchmark
from posdebias.cli import main

SIMULATED = ("--adapter", "synthetic")

#: Characters that broke or could break us: markup, separators, escapes, line separators.
HOSTILE = "[]/\\:.~$%{}!*?'\"`|<>&;#@ \t\n\r\x00\x1b\x07\x7f\u2028\u2029\u0085\u200b\ufeff"
user_text = st.text(
    alphabet=st.one_of(st.sampled_from(HOSTILE), st.characters(codec="utf-8")),
    min_size=1,
    max_size=24,
)
markup_text = st.one_of(
    user_text,
    st.sampled_from(["[/]", "[bold]x[/bold]", "[red]", ":smile:", "../../escape", "/tmp/x"]),
)
FUZZ = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for directory, _, files in os.walk(folder):
        for name in files:
            path = Path(directory, name)
            info = path.lstat()
            found[str(path)] = (info.st_mtime_ns, info.st_size)
    return found


def within(sandbox: Path, folder: str, name: str) -> Path:
    """``sandbox/folder/name`` where that stays in the test's own folder. The commands write
    where they are told, so a name that leaves it (absolute like ``/tmp/x``, a random ``/...``,
    or ``..`` enough times) put runs in the machine's ``/tmp`` and ``/``: such a name is kept,
    made relative, under ``sandbox/folder/outside``."""
    path = sandbox / folder / name
    own = os.path.realpath(sandbox.parent) + os.sep
    if "\x00" in name or os.path.realpath(path).startswith(own):
        return path
    return sandbox / folder / "outside" / name.lstrip("/").replace("..", "._")


def run_confined(sandbox: Path, run_dir: Path | None, args: list) -> tuple[int, str]:
    """Run the CLI from inside ``sandbox``; return (exit code, stderr) after checking that
    nothing in the sandbox outside ``run_dir`` changed."""
    import contextlib
    import io

    before = snapshot(sandbox)
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(sandbox)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse
                code = exc.code
    finally:
        os.chdir(cwd)
    after = snapshot(sandbox)
    usable = run_dir is not None and "\x00" not in str(run_dir)  # a NUL: refused, nothing made
    inside = os.path.realpath(run_dir) if usable else None
    changed = [
        path
        for path, stamp in after.items()
        if before.get(path) != stamp
        and not (inside and os.path.realpath(path).startswith(inside + os.sep))
    ]
    assert changed == [], f"files written outside the run directory: {changed[:5]}"
    return code, err.getvalue()


def check(code: int, err: str) -> None:
    assert code in (0, 2), err
    assert "internal error" not in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return build_shapes_benchmark(tmp_path_factory.mktemp("fuzz-shapes"), count=6)


@pytest.fixture
def sandbox(tmp_path):
    folder = tmp_path / "sandbox"
    folder.mkdir()
    (folder / "keep.txt").write_text("the user's own file")
    return folder


@FUZZ
@given(label=markup_text)
def test_random_calibrator_labels(sandbox, label):
    config = sandbox / "config.json"
    config.write_text(json.dumps({"calibrators": [{"name": "vanilla", "label": label}]}))
    run_dir = sandbox / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["evaluate", *SIMULATED, "--config", config, "--count", "1", "--orders", "1"]
    args += ["--calibration-count", "1", "--out", run_dir]
    code, err = run_confined(sandbox, run_dir, args)
    check(code, err)


@FUZZ
@given(query=markup_text, ident=markup_text, image=markup_text)
def test_random_captions_ids_and_image_names(sandbox, shapes, query, ident, image):
    bench = sandbox / "bench"
    shutil.rmtree(bench, ignore_errors=True)
    shutil.copytree(shapes, bench)
    lines = (bench / "benchmark.jsonl").read_text(encoding="utf-8").split("\n")
    record = json.loads(lines[0])
    record.update(query=query, id=ident)
    record["images"][1] = image
    lines[0] = json.dumps(record, ensure_ascii=False)
    data = "\n".join(lines).encode("utf-8")
    (bench / "benchmark.jsonl").write_bytes(data)
    manifest = json.loads((bench / "manifest.json").read_text())
    manifest["benchmark_sha256"] = hashlib.sha256(data).hexdigest()
    (bench / "manifest.json").write_text(json.dumps(manifest))
    run_dir = sandbox / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["evaluate", *SIMULATED, "--benchmark", bench, "--count", "2", "--orders", "1"]
    args += ["--calibration-count", "1", "--calibrators", "vanilla", "--out", run_dir]
    code, err = run_confined(sandbox, run_dir, args)
    check(code, err)


@FUZZ
@given(name=markup_text)
def test_random_output_paths(sandbox, name):
    run_dir = within(sandbox, "runs", name)
    args = ["evaluate", *SIMULATED, "--count", "1", "--orders", "1", "--calibration-count", "1"]
    args += ["--calibrators", "vanilla", "--out", run_dir]
    code, err = run_confined(sandbox, run_dir, args)
    check(code, err)


@FUZZ
@given(caption=markup_text, image=markup_text)
def test_random_jsonl_sources_through_build(sandbox, caption, image):
    from PIL import Image

    root = sandbox / "images"
    root.mkdir(exist_ok=True)
    for index in range(3):
        Image.new("RGB", (8, 8), (index * 60, 0, 0)).save(root / f"{index}.png")
    rows = [{"image": f"{index}.png", "caption": f"caption {index}"} for index in range(3)]
    rows.append({"image": image, "caption": caption})
    source = sandbox / "captions.jsonl"
    source.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    out = sandbox / "out"
    shutil.rmtree(out, ignore_errors=True)
    args = ["build", "--source", "jsonl", "--root", root, "--captions", source]
    args += ["--setting", "random", "-N", "2", "--count", "2", "--out", out]
    code, err = run_confined(sandbox, out, args)
    check(code, err)


# numbers through sweep, build and calibrate ---------------------------------------------------


def whole(low: int, high: int, small: int = 3) -> st.SearchStrategy:
    """A flag's value: a small valid number, one outside ``low..high``, or text that is no
    whole number (a valid large value would make a fuzz run slow, not reveal anything)."""
    return st.one_of(
        st.integers(low, min(high, low + small - 1)).map(str),
        st.integers(max_value=low - 1).map(str),
        st.integers(min_value=high + 1, max_value=10**30).map(str),
        st.sampled_from(["1e9", "nan", "inf", "-0", "0x10", "٣", " 2", "2.5", ""]),
    )


sweep_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**7), 10**7).map(str),
    st.integers(1, 3).map(str),
    st.sampled_from(["1e9", "nan", "-inf", "", "x", "1e-320"]),
)


@FUZZ
@given(
    study=st.sampled_from(["n", "calibration_size", "top_k", "tau"]),
    values=st.lists(sweep_value, min_size=1, max_size=3),
    count=whole(1, 1_000_000),
    orders=whole(1, 1_000),
    name=markup_text,
)
def test_random_sweeps(sandbox, study, values, count, orders, name):
    out = within(sandbox, "sweeps", name)
    args = ["sweep", study, "--values", ",".join(values), *SIMULATED, "--count", count]
    args += ["--orders", orders, "--calibration-count", "1", "--calibrators"]
    args += ["vanilla,attention_guided", "--out", out]
    code, err = run_confined(sandbox, out, args)
    check(code, err)


@FUZZ
@given(
    n=whole(2, 26),
    count=whole(1, 1_000_000),
    seed=whole(0, 2**32 - 1),
    images=st.one_of(st.none(), whole(1, 1_000_000, small=8)),
    size=st.one_of(st.none(), whole(8, 4_096)),
    name=markup_text,
)
def test_random_shapes_builds(sandbox, n, count, seed, images, size, name):
    made = sandbox / "made"
    shutil.rmtree(made, ignore_errors=True)
    args = ["build", "--source", "shapes", "--root", made / "shapes", "-N", n, "--count", count]
    args += ["--seed", seed, "--setting", "random", "--out", within(sandbox, "made", name)]
    args += [] if images is None else ["--shapes-images", images]
    args += [] if size is None else ["--shapes-image-size", size]
    code, err = run_confined(sandbox, made, args)
    check(code, err)


@FUZZ
@given(
    count=whole(1, 10_000),
    n=whole(2, 26),
    seed=whole(0, 2**32 - 1),
    batch=whole(1, 4_096),
    label=markup_text,
    name=markup_text,
    one_file=st.booleans(),
)
def test_random_calibrations(sandbox, count, n, seed, batch, label, name, one_file):
    config = sandbox / "config.json"
    config.write_text(json.dumps({"calibrators": [{"name": "pride", "label": label}]}))
    out = within(sandbox, "states", name + (".json" if one_file else ""))
    args = ["calibrate", *SIMULATED, "--config", config, "--count", count, "-N", n]
    args += ["--seed", seed, "--batch-size", batch, "--out", out]
    code, err = run_confined(sandbox, out.parent if one_file else out, args)
    check(code, err)
