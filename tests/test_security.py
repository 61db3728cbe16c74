"""Security rows of docs/errors.md: nothing from an input file decides where we read, only regular
files of bounded size are read, no pickle by any route, images by an allow-list of raster formats
with a pixel cap. Each class is tried with several variants, through the CLI where it is cheap.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import build_shapes_benchmark
from posdebias.cli import main
from posdebias.errors import InputError

SIMULATED = ("--adapter", "synthetic")


def run(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    return code, captured.err


@pytest.fixture(scope="module")
def shapes_bench(tmp_path_factory):
    return build_shapes_benchmark(tmp_path_factory.mktemp("shapes"), count=8)


@pytest.fixture
def bench(shapes_bench, tmp_path):
    """A private copy of the benchmark folder (its manifest still names the shared root)."""
    import shutil

    copy = tmp_path / "bench"
    shutil.copytree(shapes_bench, copy)
    return copy


def evaluate_bench(bench, capsys):
    return run(["evaluate", *SIMULATED, "--benchmark", bench, "--count", "2"], capsys)


def edit_manifest(bench: Path, **changes):
    manifest = json.loads((bench / "manifest.json").read_text())
    manifest.update(changes)
    (bench / "manifest.json").write_text(json.dumps(manifest))


# manifest paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/etc/passwd", "../../../../etc/passwd", "sub/../../x.jsonl"])
def test_manifest_benchmark_file_is_confined(bench, capsys, name):
    edit_manifest(bench, benchmark_file=name)
    code, err = evaluate_bench(bench, capsys)
    assert code == 2 and "the manifest's benchmark_file" in err
    assert "line 1" not in err and "problems" not in err  # nothing of the file was read


def test_manifest_benchmark_file_symlink_out_is_refused(bench, capsys, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text((bench / "benchmark.jsonl").read_text())
    (bench / "benchmark.jsonl").unlink()
    (bench / "benchmark.jsonl").symlink_to(outside)
    code, err = evaluate_bench(bench, capsys)
    assert code == 2 and "leads outside" in err and "symlinks resolved" in err


@pytest.mark.parametrize("root", ["../../..", "../", "x/../../y"])
def test_manifest_relative_root_is_confined(bench, capsys, root):
    edit_manifest(bench, root=root)
    code, err = evaluate_bench(bench, capsys)
    assert code == 2 and "the manifest's root" in err and "leads outside" in err


def test_image_symlink_out_of_the_root_is_refused(bench, capsys, tmp_path):
    root = Path(json.loads((bench / "manifest.json").read_text())["root"])
    local_root = tmp_path / "root"
    import shutil

    shutil.copytree(root, local_root)
    edit_manifest(bench, root=str(local_root))
    first = json.loads((bench / "benchmark.jsonl").read_text().split("\n")[0])
    target = local_root / first["images"][0]
    secret = tmp_path / "secret.png"
    secret.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(secret)
    code, err = evaluate_bench(bench, capsys)
    assert code == 2 and "leads outside the root" in err


# regular files and size limits ------------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("flag", ["--config", "--calibration", "--benchmark"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_only_regular_files_are_read(fifo, capsys, flag, kind):
    path = fifo if kind == "fifo" else Path("/dev/zero")
    code, err = run(["evaluate", *SIMULATED, flag, path, "--count", "1"], capsys)
    # a benchmark may be a folder; a config or a calibration state must be a file
    expected = "not a folder or a regular file" if flag == "--benchmark" else "not a regular file"
    assert code == 2 and expected in err, err


def test_a_directory_is_not_read_as_a_file(tmp_path, capsys):
    code, err = run(["evaluate", *SIMULATED, "--config", tmp_path, "--count", "1"], capsys)
    assert code == 2 and "is a directory, not a file" in err


def test_a_fifo_named_by_a_manifest_is_refused(bench, capsys):
    (bench / "benchmark.jsonl").unlink()
    os.mkfifo(bench / "benchmark.jsonl")
    code, err = evaluate_bench(bench, capsys)
    assert code == 2 and "not a regular file" in err


@pytest.mark.parametrize(("flag", "size"), [("--config", 1), ("--calibration", 64)])
def test_files_over_their_size_limit_are_refused(tmp_path, capsys, flag, size):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(size * 2**20 + 1)  # sparse: no disk used
    code, err = run(["evaluate", *SIMULATED, flag, big, "--count", "1"], capsys)
    assert code == 2 and f"over the limit of {size} MiB" in err
    if flag == "--config":
        assert "over the limit of 1 MiB for a config file" in err


# safetensors only, by every route ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from posdebias.testing import save_tiny_model

    return save_tiny_model("llava", tmp_path_factory.mktemp("models") / "llava")


def _pickle_route(model: Path, route: str) -> None:
    junk = b"not even a pickle: transformers must never open this"
    if route == "index names a .bin":
        (model / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": "model-1.bin"}})
        )
        (model / "model-1.bin").write_bytes(junk)
    elif route == "index points outside":
        (model / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"lm_head.weight": "../elsewhere.safetensors"}})
        )
    elif route == "bin index":
        (model / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {}}))
    elif route == "config names a weights file":
        config = json.loads((model / "config.json").read_text())
        config["transformers_weights"] = "adapter_model.bin"
        (model / "config.json").write_text(json.dumps(config))
    else:  # a pickled file beside the safetensors: plain, variant, sharded, PEFT, TF
        (model / route).write_bytes(junk)


ROUTES = [
    "index names a .bin",
    "index points outside",
    "bin index",
    "config names a weights file",
    "pytorch_model.bin",
    "pytorch_model.fp16.bin",
    "pytorch_model-00001-of-00002.bin",
    "adapter_model.bin",
    "model.pt",
    "tf_model.h5",
]


@pytest.mark.parametrize("route", ROUTES)
def test_pickled_weights_are_refused_by_every_route(tmp_path, tiny_model, route):
    import shutil

    from posdebias.loading import load_adapter

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    _pickle_route(model, route)
    with pytest.raises(InputError, match="loads safetensors weights only"):
        load_adapter(model)


def test_pickled_weights_through_the_cli_and_trainer_leftovers_are_fine(
    tmp_path, tiny_model, bench, capsys
):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    for leftover in ("training_args.bin", "optimizer.pt", "rng_state.pth"):
        (model / leftover).write_bytes(b"trainer state, never loaded")
    args = ["evaluate", "--model", model, "--benchmark", bench, "--count", "1", "--orders", "1",
            "--calibration-count", "5"]  # fmt: skip
    code, err = run([*args, "--calibrators", "vanilla"], capsys)
    assert code == 0, err
    _pickle_route(model, "index names a .bin")
    code, err = run([*args, "--calibrators", "vanilla"], capsys)
    assert code == 2 and "model-1.bin" in err and "safetensors weights only" in err


# images: raster allow-list, pixel cap, early downscale -------------------------------------------


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb's first bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


NOT_ALLOWED = {
    "eps": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    "ppm": b"P6\n2 2\n255\n" + bytes(12),
    "xbm": b"#define x_width 8\n#define x_height 1\nstatic char x_bits[] = { 0x00 };\n",
    "ico": None,  # written with Pillow below
    "text": b"this is not an image",
}


@pytest.mark.parametrize("kind", sorted(NOT_ALLOWED))
def test_only_raster_formats_are_opened(tmp_path, kind):
    from posdebias._images import open_image

    path = tmp_path / "image.png"  # the name says png; the content decides
    if NOT_ALLOWED[kind] is None:
        Image.new("RGB", (16, 16)).save(tmp_path / "x.ico")
        path.write_bytes((tmp_path / "x.ico").read_bytes())
    else:
        path.write_bytes(NOT_ALLOWED[kind])
    with pytest.raises(InputError, match=r"not one of the allowed formats \(PNG, JPEG, WEBP"):
        open_image(path)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_allowed_formats_open(tmp_path, fmt):
    from posdebias._images import open_image

    path = tmp_path / f"image.{fmt.lower()}"
    Image.new("RGB", (20, 10), (200, 30, 30)).save(path, format=fmt)
    image = open_image(path)
    assert image.size == (20, 10) and image.mode == "RGB"


def test_an_eps_image_in_a_benchmark_is_refused_through_the_cli(bench, capsys):
    root = Path(json.loads((bench / "manifest.json").read_text())["root"])
    first = json.loads((bench / "benchmark.jsonl").read_text().split("\n")[0])
    victim = root / first["images"][0]
    original = victim.read_bytes()
    try:
        victim.write_bytes(NOT_ALLOWED["eps"])
        args = ["evaluate", "--model", "posdebias/organism", "--benchmark", bench,
                "--calibration-count", "5"]  # fmt: skip
        code, err = run(
            [*args, "--count", "2", "--orders", "1", "--calibrators", "vanilla"], capsys
        )
    finally:
        victim.write_bytes(original)
    assert code == 2 and "not one of the allowed formats" in err


@pytest.mark.parametrize(
    ("size", "cap"), [((4000, 3000), 10_000_000), ((3000, 3000), 1_000_000), ((200, 100), 10_000)]
)
def test_too_many_pixels_is_a_clear_error(tmp_path, monkeypatch, size, cap):
    from posdebias._images import open_image

    monkeypatch.setenv("POSDEBIAS_MAX_IMAGE_PIXELS", str(cap))
    path = tmp_path / "big.png"
    path.write_bytes(_png_header_only(*size))
    with pytest.raises(InputError, match=rf"too large to decode \({size[0]} x {size[1]}"):
        open_image(path)


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path):
    from posdebias._images import open_image

    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header_only(100_000, 100_000))  # 10^10 pixels in 100 bytes
    with pytest.raises(InputError, match="too large to decode"):
        open_image(path)


def test_pixel_cap_setting_must_be_a_number(tmp_path, monkeypatch):
    from posdebias._images import open_image

    Image.new("RGB", (4, 4)).save(tmp_path / "x.png")
    for value in ("-5", "lots", "1e9"):
        monkeypatch.setenv("POSDEBIAS_MAX_IMAGE_PIXELS", value)
        with pytest.raises(InputError, match="POSDEBIAS_MAX_IMAGE_PIXELS"):
            open_image(tmp_path / "x.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_large_images_are_shrunk_while_opening_never_below_what_is_asked(tmp_path, fmt):
    from posdebias._images import open_image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(1500, 2000, 3), dtype=np.uint8)
    path = tmp_path / f"big.{fmt.lower()}"
    Image.fromarray(pixels).save(path, format=fmt)
    small = open_image(path, min_side=300)
    assert min(small.size) >= 300 and min(small.size) < 600  # shrunk, not below min_side
    assert small.size[0] / small.size[1] == pytest.approx(2000 / 1500, rel=0.01)
    assert open_image(path).size == (2000, 1500)  # without a target: untouched


def test_min_image_side_follows_the_processor(tiny_model):
    from transformers import AutoProcessor

    from posdebias._images import min_image_side

    processor = AutoProcessor.from_pretrained(tiny_model)
    assert processor.image_processor.size.shortest_edge == 28
    assert min_image_side(processor) == 2 * 28  # crop 28 x 28, shortest edge 28
    assert min_image_side(object()) is None


def test_a_truncated_image_is_a_clear_error(tmp_path):
    from posdebias._images import open_image

    path = tmp_path / "cut.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(path)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(InputError, match="cannot be read as an image"):
        open_image(path)


def test_a_truncated_image_is_refused_even_when_pillow_was_told_to_accept_them(tmp_path):
    """lmms-eval switches Pillow's process-wide LOAD_TRUNCATED_IMAGES on when imported; our
    reader must still refuse a truncated file, and leave the global as it found it."""
    from PIL import ImageFile

    from posdebias._images import open_image

    path = tmp_path / "cut.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(path)
    path.write_bytes(path.read_bytes()[:60])
    before = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with pytest.raises(InputError, match="cannot be read as an image"):
            open_image(path)
        assert ImageFile.LOAD_TRUNCATED_IMAGES is True
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = before


def test_no_image_opens_without_the_allow_list():
    """Every place that opens image files goes through open_image (grep for Image.open)."""
    source = Path(__file__).parents[1] / "src" / "posdebias"
    offenders = [
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        if "Image.open(" in path.read_text() and path.name != "_images.py"
    ]
    assert offenders == []


# -- whole-string patterns: `$` also matches before a final newline ------------------------


def test_no_whole_string_pattern_ends_in_a_dollar():
    """A name checked by ``^...$`` lets ``"ok\\n"`` through (``$`` matches before a final
    newline): every pattern that checks a whole string in the package ends in ``\\Z``."""
    import ast

    offenders = []
    for path in sorted((Path(__file__).parents[1] / "src" / "posdebias").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id == "re" and node.args):
                continue
            pattern = node.args[0]
            literal = isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)
            if literal and pattern.value.endswith("$") and not pattern.value.endswith("\\$"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.parametrize("name", ["ok\n", "ok\r\n", "ok\n\n", "\nok"])
def test_names_with_a_newline_fail_the_safe_patterns(name):
    from posdebias.errors import ConfigError
    from posdebias.evaluation.config import CalibratorSpec
    from posdebias.evaluation.states import check_label
    from posdebias.integrations.lmms_eval_tasks import write_rotated_tasks

    with pytest.raises(ConfigError, match="cannot name a file"):
        check_label(name)
    with pytest.raises(ValueError, match="a label names a file"):
        CalibratorSpec(name="vanilla", label=name)
    with pytest.raises(InputError, match="task name"):
        write_rotated_tasks("unused", "unused", name=name)
    with pytest.raises(InputError, match="not a name"):
        write_rotated_tasks("unused", "unused", name="task", calibrators=[name])
