"""Benchmark 2: end-to-end cost per test instance of each method, as ratios against vanilla.

One instance, from its image files to the calibrated choice: preprocessing, the prompt forward,
label scoring, and the calibrator. ``vanilla`` and ``pride`` read the label scores only (plain
SDPA); ``attention_guided`` needs the attention probe in the same forward; ``permutation_average``
observes the N cyclic rotations (N forwards). Methods alternate inside each repetition (the
order rotates), all in one process, so the ratios against vanilla share the machine's state.

    python perf/end_to_end.py                        # CPU, N = 4, 8, 12, 256 tokens/image
    python perf/end_to_end.py --device cuda --tokens-per-image 1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

METHODS = ("vanilla", "pride", "attention_guided", "permutation_average")


def observe(adapter, instance, attention: bool):
    """One instance's observation through the adapter's public batch API (batch of one)."""
    from posdebias.core.observation import Observation

    scores, masses = adapter.run_batch(adapter.prepare_batch([instance]), attention=attention)
    return Observation(
        label_logprobs=scores[0].double().cpu().numpy(),
        attention=None if masses is None else masses[0].double().numpy(),
        target=instance.target,
    )


def per_instance(adapter, calibrators, states, method: str, instance):
    """The calibrated choice for one instance, paying only what ``method`` needs."""
    from posdebias.core.symmetry import cyclic_rotations

    calibrator = calibrators[method]
    if calibrator.needs_rotations:
        group = [observe(adapter, view, False) for view in cyclic_rotations(instance)]
        return calibrator.predict(group[0], states[method], rotations=group).choice
    observation = observe(adapter, instance, calibrator.needs_attention)
    return calibrator.predict(observation, states[method]).choice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="end_to_end.json")
    parser.add_argument("--n-list", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args, info = common.start(parser)
    from posdebias.evaluation.runner import fit_calibrators
    from posdebias.registry import get_registry

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    registry = get_registry()
    methods = ["vanilla", *[m for m in args.methods if m != "vanilla"]]
    calibrators = {name: registry.create_calibrator(name) for name in methods}
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.n_list:
            instances = common.make_instances(
                args.repeats + 1, n, args.tokens_per_image, Path(tmp) / f"n{n}"
            )
            calibration, tests = instances[:1], instances[1:]
            states = fit_calibrators(adapter, calibrators, calibration)  # M=1: N rotations
            length = adapter.prepare_batch(tests[:1]).inputs["input_ids"].shape[1]
            for method in methods:  # warm-up
                per_instance(adapter, calibrators, states, method, tests[0])
            times = {m: [] for m in methods}
            peaks = {m: [] for m in methods}
            for repeat, instance in enumerate(tests):
                shift = repeat % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    seconds, peak, _ = common.measure(
                        lambda m=method, i=instance, s=states: per_instance(
                            adapter, calibrators, s, m, i
                        ),
                        args.device,
                    )
                    times[method].append(seconds)
                    peaks[method].append(peak)
            for method in methods:
                record = common.ratio_record(
                    times[method], peaks[method], times["vanilla"], peaks["vanilla"],
                    n=n, tokens=length, method=method,
                )  # fmt: skip
                records.append(record)
                rows.append([n, length, method, *common.ratio_cells(record)])
                median = record["seconds"]["median"]
                print(f"  N={n} {method}: {median:.3f} s x{record['time_ratio']:.3f}", flush=True)
    table = common.print_table(
        f"End to end per instance ({args.tokens_per_image} tokens/image, {args.layers} layers, "
        f"width {args.hidden}, {args.dtype}, {args.device}, {args.repeats} instances)",
        [
            "N",
            "T",
            "method",
            "s/instance (min-max)",
            "time / vanilla",
            "peak MiB",
            "memory / vanilla",
        ],
        rows,
    )
    common.write_results("end_to_end", args, info, records, table)


if __name__ == "__main__":
    main()
