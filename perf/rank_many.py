"""Benchmark 6: application throughput, Debiaser.rank_many queries per second at batch 1 vs 8.

The benchmark model (the Qwen2.5-VL test model with a wider language model, 256-token images,
N = 4) behind a Debiaser holding attention_guided and vanilla (one forward pass serves both).
For each batch size: the seconds of ``rank_many(queries, batch_size=B)`` (observation,
calibrators, Ranking objects) against the seconds of the adapter's own
``observe_many(instances, batch_size=B)`` for the same queries, which is the ceiling; the two
alternate over the repetitions. The rankings at every batch size are compared with batch 1.

    python perf/rank_many.py                          # ~2 min (float32, one thread)
    python perf/rank_many.py --device cuda --dtype bfloat16 --queries 64
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
    common.add_common_arguments(parser, default_out="rank_many.json")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.set_defaults(repeats=2, dtype="float32")
    args, info = common.start(parser)
    import numpy as np

    from posdebias import Debiaser

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    with tempfile.TemporaryDirectory() as tmp:
        instances = common.make_instances(
            args.queries + 2, args.n, args.tokens_per_image, Path(tmp)
        )
        calibration, queries = instances[:2], instances[2:]
        # different caption lengths: batches are left padded, as real queries are
        queries = [
            type(q)(q.stem + " seen from the left" * (i % 3), q.images, None, q.id)
            for i, q in enumerate(queries)
        ]
        debiaser = Debiaser(adapter, ["attention_guided", "vanilla"])
        debiaser.calibrate(calibration)
        list(debiaser.rank_many(queries[:2], batch_size=2))  # warm-up
        seconds: dict[tuple[str, int], list[float]] = {}
        rankings = {}
        for repeat in range(args.repeats):
            shift = repeat % len(args.batch_sizes)
            for size in args.batch_sizes[shift:] + args.batch_sizes[:shift]:
                calls = {
                    "rank_many": lambda s=size: list(debiaser.rank_many(queries, batch_size=s)),
                    "observe_many": lambda s=size: adapter.observe_many(queries, batch_size=s),
                }
                for mode in (
                    ("rank_many", "observe_many")
                    if repeat % 2 == 0
                    else ("observe_many", "rank_many")
                ):
                    elapsed, _, result = common.measure(calls[mode], args.device)
                    seconds.setdefault((mode, size), []).append(elapsed)
                    if mode == "rank_many":
                        rankings.setdefault(size, result)
    reference = rankings[args.batch_sizes[0]]
    base = common.spread(seconds[("rank_many", args.batch_sizes[0])])["median"]
    rows, records = [], []
    for size in args.batch_sizes:
        ranked = common.spread(seconds[("rank_many", size)])
        observed = common.spread(seconds[("observe_many", size)])
        difference = max(
            float(np.max(np.abs(a.of(label).scores - b.of(label).scores)))
            for a, b in zip(rankings[size], reference, strict=True)
            for label in ("attention_guided", "vanilla")
        )
        same = all(
            a.of(label).choice == b.of(label).choice
            for a, b in zip(rankings[size], reference, strict=True)
            for label in ("attention_guided", "vanilla")
        )
        record = {
            "batch_size": size,
            "rank_many_seconds": ranked,
            "observe_many_seconds": observed,
            "queries_per_second": args.queries / ranked["median"],
            "adapter_instances_per_second": args.queries / observed["median"],
            "share_of_adapter_throughput": observed["median"] / ranked["median"],
            "speedup_vs_first": base / ranked["median"],
            "max_abs_score_difference_vs_first": difference,
            "same_choices": same,
        }
        records.append(record)
        rows.append(
            [
                size,
                f"{record['queries_per_second']:.2f}",
                f"{ranked['median']:.2f} ({ranked['min']:.2f}-{ranked['max']:.2f})",
                f"{record['adapter_instances_per_second']:.2f}",
                f"{record['share_of_adapter_throughput']:.3f}",
                f"{record['speedup_vs_first']:.2f}",
                f"{difference:.1e}",
                same,
            ]
        )
    table = common.print_table(
        f"rank_many: {args.queries} queries of N={args.n} ({args.tokens_per_image} tokens/image, "
        f"{args.layers} layers, width {args.hidden}, {args.dtype}, {args.device}), "
        "attention_guided + vanilla from one pass",
        [
            "batch size",
            "queries/s",
            "total s (min-max)",
            "adapter alone, instances/s",
            "share of adapter throughput",
            "speed-up vs batch 1",
            "max |score diff|",
            "same choices",
        ],
        rows,
    )
    common.write_results("rank_many", args, info, records, table)


if __name__ == "__main__":
    main()
