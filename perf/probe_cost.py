"""Benchmark 1: the attention probe against plain SDPA and eager attention maps.

For every sequence length T and every mode, a FRESH process builds the same seeded Qwen2-style
language model, runs one warm-up forward of the prompt (KV cache kept, last logits only, as the
adapter does) and then times ``--inner`` forwards; it reports their median time and the peak
memory of one forward above the memory before it. Modes:

- ``sdpa``: plain SDPA, what any method that reads the label scores only pays;
- ``probe``: SDPA + the posdebias probe recording the last row's mass on 4 image spans;
- ``eager``: eager attention with ``output_attentions`` (every T x T map), reduced to the same
  masses, as the reference implementation does.

Processes run ``--repeats`` times per (T, mode), configurations alternating, and the tables give
the median over processes with the min-max range. Usage:

    python perf/probe_cost.py                      # CPU, T = 1k, 2k, 4k, 8k
    python perf/probe_cost.py --device cuda --layers 28 --hidden 3584 --heads 28 --kv-heads 4
    python perf/probe_cost.py --language-model qwen3_5 --layers 8   # hybrid: 2 of 8 read
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

MODES = ("sdpa", "probe", "eager")
IMAGES = 4


def child(args: argparse.Namespace) -> None:
    torch = common.setup_torch(args)
    from posdebias.adapters.attention import PROBE_NAME, recording
    from posdebias.adapters.hf.layers import attention_layers

    attention = {"sdpa": "sdpa", "probe": PROBE_NAME, "eager": "eager"}[args.mode]
    model = common.build_language_model(args, attention)
    layers = attention_layers(model.config)  # hybrid: the full-attention layers only
    length = args.tokens
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1024, (1, length), generator=generator).to(args.device)
    mask = torch.ones_like(ids)
    # 4 image spans covering 90% of the prompt, as in a 4-image retrieval prompt.
    spans = torch.zeros(1, length, IMAGES)
    width = int(0.9 * length) // IMAGES
    for image in range(IMAGES):
        start = 16 + image * width
        spans[0, start : start + width, image] = 1.0

    def forward():
        with torch.inference_mode():
            if args.mode == "probe":
                with recording(spans) as recorder:
                    model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                return recorder.attention(layers)
            if args.mode == "eager":
                out = model(
                    input_ids=ids,
                    attention_mask=mask,
                    use_cache=True,
                    logits_to_keep=1,
                    output_attentions=True,
                )
                span = spans.to(args.device, torch.float32)
                rows = [a[:, :, -1, :].float().mean(dim=1) for a in out.attentions]
                return torch.stack([torch.bmm(r[:, None, :], span)[:, 0] for r in rows], 1).cpu()
            model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            return None

    forward()  # warm-up
    times, peaks = [], []
    for _ in range(args.inner):
        seconds, peak, _ = common.measure(forward, args.device)
        times.append(seconds)
        peaks.append(peak)
    result = {"seconds": sorted(times)[len(times) // 2], "peak_bytes": max(peaks), "times": times}
    if args.mode == "probe":
        # Paired in the same process: the probed model without a recorder IS plain SDPA, so
        # alternating the two isolates the probe's own cost from process-to-process noise.
        ratios = []
        for _ in range(args.inner):
            plain, _, _ = common.measure(lambda: plain_forward(model, ids, mask), args.device)
            probed, _, _ = common.measure(forward, args.device)
            ratios.append(probed / plain)
        result["paired_ratios"] = ratios
    common.dump_json_line(result)


def plain_forward(model, ids, mask) -> None:
    import torch

    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)


def run_child(args: argparse.Namespace, mode: str, tokens: int) -> dict | None:
    command = [
        sys.executable,
        __file__,
        "--child",
        "--mode",
        mode,
        "--tokens",
        str(tokens),
        "--inner",
        str(args.inner),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--threads",
        str(args.threads),
        "--layers",
        str(args.layers),
        "--hidden",
        str(args.hidden),
        "--heads",
        str(args.heads),
        "--kv-heads",
        str(args.kv_heads),
        "--language-model",
        args.language_model,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    print(f"  {mode} T={tokens} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    return None


def _paired_cell(paired: dict | None) -> str:
    if paired is None:
        return ""
    return f"{paired['median']:.3f} ({paired['min']:.3f}-{paired['max']:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="probe_cost.json")
    parser.add_argument("--tokens-list", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--eager-max-tokens", type=int, default=8192, help="skip eager above this T"
    )
    parser.add_argument("--inner", type=int, default=4, help="timed forwards per process")
    parser.add_argument(
        "--language-model",
        choices=common.LANGUAGE_MODELS,
        default="qwen2",
        help="qwen2: dense; qwen3_5: hybrid, linear attention in 3 of 4 layers (not probed)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(repeats=3)
    args = parser.parse_args()
    common.ensure_malloc_env()
    if args.child:
        child(args)
        return
    common.setup_torch(args)
    info = common.machine(args)
    print(f"machine: {info}", flush=True)
    measured: dict[tuple[int, str], list[dict]] = {}
    for repeat in range(args.repeats):
        for tokens in args.tokens_list:
            modes = [m for m in args.modes if m != "eager" or tokens <= args.eager_max_tokens]
            shift = repeat % len(modes)  # alternate which mode runs first
            for mode in modes[shift:] + modes[:shift]:
                result = run_child(args, mode, tokens)
                if result is not None:
                    measured.setdefault((tokens, mode), []).append(result)
                    print(
                        f"  repeat {repeat} T={tokens} {mode}: {result['seconds']:.3f} s, "
                        f"{common.mib(result['peak_bytes']):.1f} MiB",
                        flush=True,
                    )
    rows, records = [], []
    for tokens in args.tokens_list:
        base = measured.get((tokens, "sdpa"))
        for mode in args.modes:
            runs = measured.get((tokens, mode))
            if not runs:
                continue
            times = common.spread([r["seconds"] for r in runs])
            peaks = common.spread([r["peak_bytes"] for r in runs])
            record = {"tokens": tokens, "mode": mode, "seconds": times, "peak_bytes": peaks}
            if base:
                base_time = common.spread([r["seconds"] for r in base])["median"]
                base_peak = common.spread([r["peak_bytes"] for r in base])["median"]
                record["time_ratio"] = times["median"] / base_time
                record["memory_ratio"] = peaks["median"] / base_peak
            if mode == "probe":
                paired = [ratio for r in runs for ratio in r.get("paired_ratios", [])]
                record["paired_ratio"] = common.spread(paired)
            records.append(record)
            rows.append(
                [
                    tokens,
                    mode,
                    f"{times['median']:.3f} ({times['min']:.3f}-{times['max']:.3f})",
                    f"{record.get('time_ratio', float('nan')):.3f}",
                    f"{common.mib(peaks['median']):.1f} "
                    f"({common.mib(peaks['min']):.1f}-{common.mib(peaks['max']):.1f})",
                    f"{record.get('memory_ratio', float('nan')):.3f}",
                    _paired_cell(record.get("paired_ratio")),
                ]
            )
    table = common.print_table(
        f"Probe cost ({args.language_model}, {args.layers} layers, width {args.hidden}, "
        f"{args.heads} heads / "
        f"{args.kv_heads} KV heads, {args.dtype}, {args.device}, {args.repeats} processes each)",
        [
            "T",
            "mode",
            "time s (min-max)",
            "time / sdpa",
            "peak MiB (min-max)",
            "memory / sdpa",
            "paired time / sdpa (min-max)",
        ],
        rows,
    )
    common.write_results("probe_cost", args, info, records, table)


if __name__ == "__main__":
    main()
