"""Benchmark 6: cost of the generated baselines and of SoFA, as ratios measured in one run.

* self-consistency (10 samples, T = 0.7, top-k 40) vs ONE chain-of-thought generation of the
  same length: the samples share one prompt pass (the KV cache is repeated after the prefill),
  so the ratio should stay well below 10 (target: at most 1.5). Both generate exactly
  ``--new-tokens`` tokens (no early stop), so the lengths are equal.
* SoFA scored vs scored vanilla: the same observation call (prompt forward + label scoring, with
  the attention probe as in a run), once under the SoFA mask (every second layer); target: at
  most 1.05.

Methods alternate inside each repetition, all in one process, on the benchmark model of
``_common`` (a Qwen2.5-VL layout with realistic sequence lengths).

    python perf/decoding.py                          # CPU, N = 4, 8, 256 tokens/image
    python perf/decoding.py --device cuda --tokens-per-image 1024 --new-tokens 256
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
    common.add_common_arguments(parser, default_out="decoding.json")
    parser.add_argument("--n-list", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--tokens-per-image", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--samples", type=int, default=10, help="self-consistency samples")
    parser.add_argument(
        "--pairs",
        nargs="+",
        choices=("generation", "sofa"),
        default=["generation", "sofa"],
        help="which comparisons to run",
    )
    args, info = common.start(parser)
    from posdebias.adapters import GenerationSettings
    from posdebias.adapters.attention.sofa import SofaSettings, sofa_attention

    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    cot = GenerationSettings(max_new_tokens=args.new_tokens, stop_at_eos=False)
    sc = GenerationSettings(
        max_new_tokens=args.new_tokens,
        stop_at_eos=False,
        do_sample=True,
        temperature=0.7,
        top_k=40,
        num_samples=args.samples,
    )

    def vanilla(instance):
        return adapter.observe_many([instance])

    def sofa(instance):
        with sofa_attention(SofaSettings(sigma=0.5, layer_stride=2)) as run:
            result = adapter.observe_many([instance])
        assert run.changed_layers, "SoFA did not take effect"
        return result

    methods = {
        "chain_of_thought": lambda i: adapter.generate_many([i], cot, seeds=[0]),
        "self_consistency": lambda i: adapter.generate_many([i], sc, seeds=[0]),
        "vanilla_scored": vanilla,
        "sofa_scored": sofa,
    }
    baselines = {
        name: base
        for name, base, pair in (
            ("self_consistency", "chain_of_thought", "generation"),
            ("sofa_scored", "vanilla_scored", "sofa"),
        )
        if pair in args.pairs
    }
    methods = {m: f for m, f in methods.items() if m in baselines or m in baselines.values()}
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.n_list:
            instances = common.make_instances(
                args.repeats + 1, n, args.tokens_per_image, Path(tmp) / f"n{n}"
            )
            length = adapter.prepare_batch(instances[:1]).inputs["input_ids"].shape[1]
            names = list(methods)
            for name in names:  # warm-up
                methods[name](instances[0])
            times = {m: [] for m in names}
            peaks = {m: [] for m in names}
            for repeat, instance in enumerate(instances[1:]):
                shift = repeat % len(names)
                for name in names[shift:] + names[:shift]:
                    seconds, peak, _ = common.measure(
                        lambda m=name, i=instance: methods[m](i), args.device
                    )
                    times[name].append(seconds)
                    peaks[name].append(peak)
            for name, base in baselines.items():
                record = common.ratio_record(
                    times[name], peaks[name], times[base], peaks[base],
                    n=n, tokens=length, method=name, baseline=base,
                    baseline_seconds=common.spread(times[base]),
                )  # fmt: skip
                records.append(record)
                rows.append([n, length, name, base, *common.ratio_cells(record)])
                paired = common.spread(record["paired_time_ratios"])["median"]
                print(
                    f"  N={n} {name} / {base}: x{record['time_ratio']:.3f} (paired median "
                    f"x{paired:.3f}) "
                    f"({record['seconds']['median']:.3f} s vs "
                    f"{record['baseline_seconds']['median']:.3f} s)",
                    flush=True,
                )
    table = common.print_table(
        f"Generated baselines and SoFA ({args.tokens_per_image} tokens/image, {args.new_tokens} "
        f"new tokens, {args.samples} samples, {args.layers} layers, width {args.hidden}, "
        f"{args.dtype}, {args.device}, {args.repeats} instances)",
        [
            "N",
            "T",
            "method",
            "baseline",
            "s/instance (min-max)",
            "time / baseline",
            "peak MiB",
            "memory / baseline",
        ],
        rows,
    )
    common.write_results("decoding", args, info, records, table)


if __name__ == "__main__":
    main()
