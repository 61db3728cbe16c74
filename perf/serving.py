"""Benchmark: a service's throughput, concurrent Debiaser.arank requests with and without
micro-batches; and the cost of torch's own thread count on a shared machine.

A bundled organism (the tiny LLaVA, or the tiny text Llama on its multiple-choice questions)
behind a Debiaser holding attention_guided and vanilla. ``--requests`` concurrent ``arank``
calls (``asyncio.gather``, as a web framework's handlers make them) are answered by a debiaser
with ``max_batch=1`` (every request its own forward: a service without micro-batches) and by one
with ``max_batch=B``; the two alternate in one process over ``--repeats`` and each repetition's
ratio is kept (paired). Also printed: the longest the event loop went without running (a
ticker task every millisecond), the largest score difference between the batched and the
unbatched answers and whether every choice is the same. The threads table times ``rank`` (one
query, its forward alone) with 1 torch thread and with torch's default (one per core),
alternating.

    python perf/serving.py                        # ~1 min (organism, one thread)
    python perf/serving.py --model text-organism --max-batch 8 16 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="serving.json")
    parser.add_argument("--model", choices=("organism", "text-organism"), default="organism")
    parser.add_argument("--requests", type=int, default=64, help="concurrent requests")
    parser.add_argument("--max-batch", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-wait", type=float, default=0.005, help="seconds")
    parser.add_argument("--single", type=int, default=20, help="queries timed per thread count")
    parser.set_defaults(repeats=3, dtype="float32")
    args, info = common.start(parser)
    import numpy as np
    import torch

    import posdebias
    from posdebias import Debiaser
    from posdebias.benchmarks import load_benchmark

    if args.model == "organism":
        from posdebias.organism import bundled_benchmark

        adapter = posdebias.load_adapter("posdebias/organism")
        items = load_benchmark(bundled_benchmark(4)).instances
    else:
        from posdebias.organism.text import bundled_text_benchmark

        adapter = posdebias.load_adapter("posdebias/text-organism", label_set="upper")
        items = load_benchmark(bundled_text_benchmark(4)).instances
    calibration, queries = items[:5], items[5 : 5 + args.requests]
    labels = ["attention_guided", "vanilla"]
    unbatched = Debiaser(adapter, labels, threads=args.threads, max_batch=1)
    unbatched.calibrate(calibration)

    def twin(**settings: object) -> Debiaser:
        """A debiaser with the same calibration and other settings."""
        debiaser = Debiaser(adapter, labels, **{"threads": args.threads, **settings})
        debiaser.states = unbatched.states
        return debiaser

    debiasers = {1: unbatched}
    for size in args.max_batch:
        debiasers[size] = twin(max_batch=size, max_wait=args.max_wait)

    async def serve(debiaser: Debiaser) -> tuple[float, float, list]:
        stalls = [0.0]

        async def ticker() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls[0] = max(stalls[0], now - last)
                last = now

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        rankings = await asyncio.gather(*(debiaser.arank(q.stem, q.images) for q in queries))
        elapsed = time.perf_counter() - started
        task.cancel()
        return elapsed, stalls[0], rankings

    asyncio.run(serve(debiasers[args.max_batch[0]]))  # warm-up
    seconds: dict[int, list[float]] = {size: [] for size in debiasers}
    stalls: dict[int, list[float]] = {size: [] for size in debiasers}
    answers: dict[int, list] = {}
    for repeat in range(args.repeats):
        order = list(debiasers) if repeat % 2 == 0 else list(reversed(debiasers))
        for size in order:
            elapsed, stall, rankings = asyncio.run(serve(debiasers[size]))
            seconds[size].append(elapsed)
            stalls[size].append(stall)
            answers.setdefault(size, rankings)
    rows, records = [], []
    for size in debiasers:
        spread = common.spread(seconds[size])
        paired = [base / own for base, own in zip(seconds[1], seconds[size], strict=True)]
        difference = max(
            float(np.max(np.abs(a.of(label).scores - b.of(label).scores)))
            for a, b in zip(answers[size], answers[1], strict=True)
            for label in labels
        )
        same = all(
            a.of(label).order == b.of(label).order
            for a, b in zip(answers[size], answers[1], strict=True)
            for label in labels
        )
        record = {
            "max_batch": size,
            "seconds": spread,
            "requests_per_second": args.requests / spread["median"],
            "paired_speedups": paired,
            "speedup_median": float(np.median(paired)),
            "longest_event_loop_stall_ms": 1000 * max(stalls[size]),
            "max_abs_score_difference_vs_unbatched": difference,
            "same_orders": same,
        }
        records.append(record)
        rows.append(
            [
                size,
                f"{record['requests_per_second']:.1f}",
                f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})",
                " ".join(f"{r:.2f}" for r in paired),
                f"{record['longest_event_loop_stall_ms']:.1f}",
                f"{difference:.1e}",
                same,
            ]
        )
    table = common.print_table(
        f"serving: {args.requests} concurrent arank requests, {args.model}, N=4, "
        f"attention_guided + vanilla, {args.threads} torch thread(s), max_wait "
        f"{args.max_wait * 1000:g} ms",
        [
            "max_batch",
            "requests/s",
            "seconds (min-max)",
            "speed-up vs max_batch 1, per repetition",
            "longest event-loop stall, ms",
            "max |score diff|",
            "same orders",
        ],
        rows,
    )
    # torch's threads: one query's forward alone, 1 thread vs one per core (torch's default)
    cores = os.cpu_count() or 1
    single: dict[int, list[float]] = {1: [], cores: []}
    for repeat in range(args.repeats):
        for threads in (1, cores) if repeat % 2 == 0 else (cores, 1):
            debiaser = twin(threads=threads)
            started = time.perf_counter()
            for query in queries[: args.single]:
                debiaser.rank(query.stem, query.images)
            single[threads].append((time.perf_counter() - started) / args.single)
    thread_rows = [
        [
            threads,
            f"{1000 * common.spread(values)['median']:.1f}",
            " ".join(f"{1000 * v:.1f}" for v in values),
        ]
        for threads, values in single.items()
    ]
    thread_table = common.print_table(
        f"one query's rank (ms), torch threads, load average {os.getloadavg()[0]:.2f} on "
        f"{cores} cores",
        ["torch threads", "ms per query (median)", "per repetition"],
        thread_rows,
    )
    torch.set_num_threads(args.threads)
    common.write_results(
        "serving",
        args,
        info,
        records,
        table + "\n\n" + thread_table,
        threads={str(k): common.spread(v) for k, v in single.items()},
    )


if __name__ == "__main__":
    main()
