"""Benchmark 5: calibration cost, M instances x N cyclic rotations, batched vs one by one.

The symmetrised calibration set (METHOD.md "Calibration") is observed with batch size 1 and with
batch size N (the N rotations of an instance share the prompt length, so no padding), the two
alternating; the observations are compared.

    python perf/calibration.py                       # M = 5, N = 4
    python perf/calibration.py --device cuda --n 12 --tokens-per-image 1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="calibration.json")
    parser.add_argument("--m", type=int, default=5, help="calibration instances")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=None, help="default: N")
    parser.set_defaults(repeats=2, dtype="float32")
    args, info = common.start(parser)
    import numpy as np

    from posdebias.core.symmetry import symmetrized_calibration_set

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    batched_size = args.batch_size or args.n
    sizes = {"one by one": 1, f"batched ({batched_size})": batched_size}
    with tempfile.TemporaryDirectory() as tmp:
        calibration = common.make_instances(args.m, args.n, args.tokens_per_image, Path(tmp))
        symmetrized = symmetrized_calibration_set(calibration)
        adapter.observe_many(symmetrized[:2], batch_size=2)  # warm-up
        seconds = {label: [] for label in sizes}
        peaks = {label: [] for label in sizes}
        outputs = {}
        for repeat in range(args.repeats):
            labels = list(sizes) if repeat % 2 == 0 else list(sizes)[::-1]
            for label in labels:
                elapsed, peak, observed = common.measure(
                    lambda s=sizes[label]: adapter.observe_many(symmetrized, batch_size=s),
                    args.device,
                )
                seconds[label].append(elapsed)
                peaks[label].append(peak)
                outputs.setdefault(label, observed)
    first = next(iter(sizes))
    rows, records = [], []
    base = common.spread(seconds[first])["median"]
    for label, size in sizes.items():
        t = common.spread(seconds[label])
        diff = max(
            float(np.max(np.abs(a.label_logprobs - b.label_logprobs)))
            for a, b in zip(outputs[label], outputs[first], strict=True)
        )
        record = {
            "mode": label,
            "batch_size": size,
            "observations": len(symmetrized),
            "seconds": t,
            "speedup": base / t["median"],
            "peak_bytes": common.spread(peaks[label]),
            "max_abs_score_difference": diff,
        }
        records.append(record)
        rows.append(
            [
                label,
                len(symmetrized),
                f"{t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f})",
                f"{record['speedup']:.2f}",
                f"{common.mib(record['peak_bytes']['median']):.0f}",
                f"{diff:.1e}",
            ]
        )
    table = common.print_table(
        f"Calibration: M={args.m} x N={args.n} rotations ({args.tokens_per_image} tokens/image, "
        f"{args.layers} layers, width {args.hidden}, {args.dtype}, {args.device})",
        ["mode", "observations", "total s (min-max)", "speed-up", "peak MiB", "max |score diff|"],
        rows,
    )
    common.write_results("calibration", args, info, records, table)


if __name__ == "__main__":
    main()
