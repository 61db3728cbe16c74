"""Benchmark 4: throughput at batch sizes 1, 2, 4, 8, and that batching changes no result.

The same instances (queries of different lengths, so batches are left padded) are observed
through ``adapter.observe_many(..., batch_size=B)``; batch sizes alternate across repetitions.
Every batch size's label scores and attention masses are compared with batch size 1.

    python perf/batching.py                          # float32: differences ~1e-6
    python perf/batching.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="batching.json")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.set_defaults(repeats=3, dtype="float32")
    args, info = common.start(parser)
    import numpy as np

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    with tempfile.TemporaryDirectory() as tmp:
        instances = common.make_instances(args.instances, args.n, args.tokens_per_image, Path(tmp))
        # different query lengths: batches need left padding
        instances = [
            type(inst)(
                query=inst.stem + " with more words" * (index % 3),
                images=inst.images,
                target=inst.target,
                id=inst.id,
            )
            for index, inst in enumerate(instances)
        ]
        adapter.observe_many(instances[:2], batch_size=2)  # warm-up
        seconds = {size: [] for size in args.batch_sizes}
        peaks = {size: [] for size in args.batch_sizes}
        outputs = {}
        for repeat in range(args.repeats):
            shift = repeat % len(args.batch_sizes)
            for size in args.batch_sizes[shift:] + args.batch_sizes[:shift]:
                started = time.perf_counter()
                elapsed, peak, observed = common.measure(
                    lambda s=size: adapter.observe_many(instances, batch_size=s), args.device
                )
                seconds[size].append(elapsed)
                peaks[size].append(peak)
                outputs.setdefault(size, observed)
                del started
    reference = outputs[args.batch_sizes[0]]
    rows, records = [], []
    for size in args.batch_sizes:
        t = common.spread(seconds[size])
        score_diff = max(
            float(np.max(np.abs(a.label_logprobs - b.label_logprobs)))
            for a, b in zip(outputs[size], reference, strict=True)
        )
        attention_diff = max(
            float(np.max(np.abs(a.attention - b.attention)))
            for a, b in zip(outputs[size], reference, strict=True)
        )
        choices_equal = all(
            int(np.argmax(a.label_logprobs)) == int(np.argmax(b.label_logprobs))
            for a, b in zip(outputs[size], reference, strict=True)
        )
        record = {
            "batch_size": size,
            "seconds": t,
            "instances_per_second": args.instances / t["median"],
            "peak_bytes": common.spread(peaks[size]),
            "max_abs_score_difference_vs_first": score_diff,
            "max_abs_attention_difference_vs_first": attention_diff,
            "argmax_equal": choices_equal,
        }
        records.append(record)
        rows.append(
            [
                size,
                f"{record['instances_per_second']:.2f}",
                f"{t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f})",
                f"{common.mib(record['peak_bytes']['median']):.0f}",
                f"{score_diff:.1e}",
                f"{attention_diff:.1e}",
                choices_equal,
            ]
        )
    table = common.print_table(
        f"Batching: {args.instances} instances of N={args.n} ({args.tokens_per_image} "
        f"tokens/image, {args.layers} layers, width {args.hidden}, {args.dtype}, {args.device})",
        [
            "batch size",
            "instances/s",
            "total s (min-max)",
            "peak MiB",
            "max |score diff|",
            "max |attention diff|",
            "same argmax",
        ],
        rows,
    )
    common.write_results("batching", args, info, records, table)


if __name__ == "__main__":
    main()
