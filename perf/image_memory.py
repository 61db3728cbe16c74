"""Benchmark 6: peak memory of decoding one forward batch of huge images, before and after the
early downscale (``posdebias._images.open_image``).

A benchmark of very large, well-compressed PNGs (the report that started this: 10000 x 9500
pixels, 277 KB each) used to be decoded at full size for a whole batch before the processor
shrank them. Each setting runs in a fresh child process that decodes ``--images`` files the way
the adapter's batch preparation does and keeps them all (a batch is held until the processor has
seen it); the figure is the child's peak resident memory above its start.

* ``full decode``: ``Image.open(path).convert("RGB")`` per image (what loading did before).
* ``open_image``: raster allow-list, pixel cap, and shrinking to ``--min-side`` while opening
  (twice the 336 px a LLaVA-1.5 processor resizes to): only one image is ever full size.

    python perf/image_memory.py                       # 20 images of 6000 x 4500
    python perf/image_memory.py --width 10000 --height 9500 --images 20   # the report
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def _child(mode: str, min_side: int, files: list[str]) -> None:
    """Decode every file, keep them all, print the peak resident bytes above the start."""
    from PIL import Image

    from posdebias._images import open_image

    meter = common.MemoryMeter("cpu")
    meter.start()
    batch = []
    for file in files:
        if mode == "full decode":
            with Image.open(file) as image:
                batch.append(image.convert("RGB"))
        else:
            batch.append(open_image(file, min_side=min_side))
    sizes = sorted({image.size for image in batch})
    print(json.dumps({"peak_bytes": meter.peak_bytes(), "decoded_sizes": sizes}))


def _write_images(folder: Path, count: int, width: int, height: int) -> list[Path]:
    """``count`` large PNGs that compress well (smooth gradients), like scanned pages or maps."""
    import numpy as np
    from PIL import Image

    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    pixels = np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=-1).astype(np.uint8)
    first = folder / "image_000.png"
    Image.fromarray(pixels).save(first, optimize=False, compress_level=6)
    files = [first]
    for index in range(1, count):
        copy = folder / f"image_{index:03d}.png"
        copy.write_bytes(first.read_bytes())
        files.append(copy)
    return files


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="image_memory.json")
    parser.add_argument("--images", type=int, default=20, help="images in one batch (20)")
    parser.add_argument("--width", type=int, default=6000)
    parser.add_argument("--height", type=int, default=4500)
    parser.add_argument("--min-side", type=int, default=672, help="shrink target (short side)")
    parser.set_defaults(dtype="float32")
    args, info = common.start(parser)
    records, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        files = _write_images(Path(tmp), args.images, args.width, args.height)
        file_kb = files[0].stat().st_size / 1024
        for mode in ("full decode", "open_image"):
            child = subprocess.run(
                [sys.executable, __file__, "--child", mode, str(args.min_side)]
                + [str(f) for f in files],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(child.stdout.strip().splitlines()[-1])
            peak = common.mib(result["peak_bytes"])
            sizes = [tuple(size) for size in result["decoded_sizes"]]
            records.append({"mode": mode, "peak_mib": peak, "decoded_sizes": sizes})
            rows.append([mode, args.images, f"{args.width} x {args.height}", peak, sizes[0]])
    title = (
        f"peak RSS of one batch of {args.images} PNGs ({args.width} x {args.height}, "
        f"{file_kb:.0f} KB each), min side {args.min_side}"
    )
    columns = ["decoding", "images", "source size", "peak MiB", "held size"]
    table = common.print_table(title, columns, rows)
    common.write_results("image_memory", args, info, records, table)


if __name__ == "__main__":
    main()
