"""Benchmark 3: multi-token labels. N = 12 labels "1".."12" need the prefix "1" scored again.

Three ways to observe the SAME 12-image prompt, alternating, in one process:

- ``n12_cached``: the adapter's way: the prompt forward, then one cached decoding step per
  multi-token prefix on top of the prompt's KV cache (scoring.py);
- ``n12_reforward``: the reference implementation's way: a full forward of prompt + prefix for
  every multi-token prefix (no cache reuse);
- ``n9_labels``: the same prompt scored with the 9 single-token labels "1".."9" (no decoding
  step): what N = 12 would cost if its labels were single tokens. Same T, so the ratio
  n12_cached / n9_labels is the price of multi-token labels alone.

All three run the attention probe (the attention-guided method's observation). The cached and
re-forward scores are compared (they must agree to the dtype's rounding).

    python perf/label_scoring.py
    python perf/label_scoring.py --device cuda --tokens-per-image 1024
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

MODES = ("n9_labels", "n12_cached", "n12_reforward")


def reforward_scores(adapter, batch):
    """[B, N] scores from the prompt forward plus one full re-forward per multi-token prefix."""
    import torch

    from posdebias.adapters.attention import recording
    from posdebias.adapters.hf.scoring import restricted_scores
    from posdebias.adapters.hf.spans import span_matrix

    inputs = dict(batch.inputs)
    prompt = inputs["input_ids"]
    length = prompt.shape[1]
    with torch.inference_mode():
        with recording(span_matrix(batch.spans, length)) as recorder:
            output = adapter.model(**inputs, position_ids=batch.position_ids, logits_to_keep=1)
        masses = recorder.attention(adapter.num_layers)
        step_logits = {(): output.logits[:, -1, :]}
        for prefix in batch.plan.steps:
            extra = torch.tensor([list(prefix)] * prompt.shape[0], device=prompt.device)
            full = dict(inputs)
            full["input_ids"] = torch.cat([prompt, extra.to(prompt.dtype)], dim=1)
            full["attention_mask"] = torch.cat(
                [inputs["attention_mask"], torch.ones_like(extra, dtype=prompt.dtype)], dim=1
            )
            if "mm_token_type_ids" in full:
                zeros = torch.zeros_like(extra, dtype=full["mm_token_type_ids"].dtype)
                full["mm_token_type_ids"] = torch.cat([full["mm_token_type_ids"], zeros], dim=1)
            step_logits[prefix] = adapter.model(**full, logits_to_keep=1).logits[:, -1, :]
        return restricted_scores(batch.plan, step_logits), masses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="label_scoring.json")
    parser.add_argument("--tokens-per-image", type=int, default=256)
    args, info = common.start(parser)
    adapter = common.build_vl_adapter(args, args.tokens_per_image)
    with tempfile.TemporaryDirectory() as tmp:
        instances = common.make_instances(args.repeats, 12, args.tokens_per_image, Path(tmp))
        batches = [adapter.prepare_batch([instance]) for instance in instances]
    text = adapter.render(instances[0])
    _, nine = adapter.plan_for(9, text)
    steps = {"n12": len(batches[0].plan.steps), "n9": len(nine.steps)}
    calls = {
        "n12_cached": lambda b: adapter.run_batch(b),
        "n12_reforward": lambda b: reforward_scores(adapter, b),
        "n9_labels": lambda b: adapter.run_batch(dataclasses.replace(b, plan=nine)),
    }
    differences = []
    for batch in batches[:1]:  # warm-up, and the cached scores against the re-forward
        for call in calls.values():
            call(batch)
        cached, _ = calls["n12_cached"](batch)
        reforward, _ = calls["n12_reforward"](batch)
        differences.append(float((cached - reforward).abs().max()))
    times = {m: [] for m in MODES}
    peaks = {m: [] for m in MODES}
    for repeat, batch in enumerate(batches):
        shift = repeat % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            seconds, peak, _ = common.measure(lambda c=calls[mode], b=batch: c(b), args.device)
            times[mode].append(seconds)
            peaks[mode].append(peak)
    length = batches[0].inputs["input_ids"].shape[1]
    rows, records = [], []
    for mode in MODES:
        record = common.ratio_record(
            times[mode], peaks[mode], times["n9_labels"], peaks["n9_labels"],
            mode=mode, tokens=length,
        )  # fmt: skip
        records.append(record)
        rows.append([mode, length, *common.ratio_cells(record)])
    table = common.print_table(
        f"Label scoring, 12-image prompt ({args.tokens_per_image} tokens/image, {args.layers} "
        f"layers, width {args.hidden}, {args.dtype}, {args.device}, {args.repeats} instances; "
        f"decoding steps: N=12 {steps['n12']}, N=9 {steps['n9']})",
        ["mode", "T", "s/instance (min-max)", "time / n9", "peak MiB", "memory / n9"],
        rows,
    )
    print(f"max |cached - reforward| label score: {max(differences):.2e}")
    common.write_results(
        "label_scoring", args, info, records, table,
        decoding_steps=steps, max_abs_difference_cached_vs_reforward=max(differences),
    )  # fmt: skip


if __name__ == "__main__":
    main()
