"""Benchmark 6: what "no silent wrong scores" costs: the verification against the model's own
forward, once per model load (posdebias.adapters.hf.verify).

Three calls on the same model, alternating, in one process:

- ``first_batch``: observing one batch of B instances the ordinary way (probe + label scores),
  the work any run does for its first batch;
- ``reference``: the model's own forward of one of those prompts (no position ids, no cache),
  which the first-batch verification adds when observing through ``observe_many``;
- ``verify``: ``adapter.verify(instance)`` from scratch (the adapter's pass of one prompt AND the
  reference), which ``posdebias evaluate`` runs before it writes anything.

Each is paid once per model load; the printed share is that cost over a whole default-sized run
(``--run-prompts``: 200 test instances x 5 orders + 5 x N calibration prompts).

    python perf/verification.py
    python perf/verification.py --device cuda --tokens-per-image 1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

MODES = ("first_batch", "reference", "verify")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="verification.json")
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.add_argument("-N", dest="n", type=int, default=4, help="images per prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="B of the first batch")
    parser.add_argument(
        "--run-prompts", type=int, default=200 * 5 + 5 * 4, help="prompts of a whole run"
    )
    args, info = common.start(parser)
    from posdebias.adapters.hf.verify import forget_verdicts, reference_scores

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    with tempfile.TemporaryDirectory() as tmp:
        count = args.repeats * args.batch_size
        instances = common.make_instances(count, args.n, args.tokens_per_image, Path(tmp))
        batches = [
            adapter.prepare_batch(instances[i : i + args.batch_size])
            for i in range(0, count, args.batch_size)
        ]

        def verify(instance):
            forget_verdicts(adapter.model)
            adapter.verify(instance)

        calls = {
            "first_batch": lambda b, i: adapter.run_batch(b),
            "reference": lambda b, i: reference_scores(adapter, i),
            "verify": lambda b, i: verify(i),
        }
        for mode in MODES:  # warm-up
            calls[mode](batches[0], instances[0])
        times = {m: [] for m in MODES}
        peaks = {m: [] for m in MODES}
        for repeat, batch in enumerate(batches):
            instance = instances[repeat * args.batch_size]
            shift = repeat % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                seconds, peak, _ = common.measure(
                    lambda c=calls[mode], b=batch, i=instance: c(b, i), args.device
                )
                times[mode].append(seconds)
                peaks[mode].append(peak)
    length = batches[0].inputs["input_ids"].shape[1]
    per_prompt = common.statistics.median(times["first_batch"]) / args.batch_size
    run_seconds = per_prompt * args.run_prompts
    rows, records = [], []
    for mode in MODES:
        record = common.ratio_record(
            times[mode], peaks[mode], times["first_batch"], peaks["first_batch"],
            mode=mode, tokens=length,
        )  # fmt: skip
        record["share_of_run"] = record["seconds"]["median"] / run_seconds
        records.append(record)
        rows.append([mode, length, *common.ratio_cells(record), f"{record['share_of_run']:.2e}"])
    table = common.print_table(
        f"Verification cost per model load ({args.n} images x {args.tokens_per_image} "
        f"tokens, first batch B={args.batch_size}, {args.layers} layers, width {args.hidden}, "
        f"{args.dtype}, {args.device}, {args.repeats} repeats; a run = {args.run_prompts} "
        "prompts)",
        ["call", "T", "s (min-max)", "time / first batch", "peak MiB", "memory / first batch",
         "share of a run"],
        rows,
    )  # fmt: skip
    common.write_results("verification", args, info, records, table, run_prompts=args.run_prompts)


if __name__ == "__main__":
    main()
