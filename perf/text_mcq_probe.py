"""The attention probe on text multiple-choice prompts: probed forward vs plain SDPA.

A Qwen3 language model (seeded random weights, the width and depth given) behind the real
``qwen3`` adapter; one multiple-choice instance per length whose 4 options are long passages,
so the rendered prompt has about T tokens (1k and 4k by default). For each T the same prepared
batch runs through ``adapter.run_batch`` with the probe recording the options' spans
(``attention=True``) and without (plain SDPA, ``attention=False``: what a method reading the
label scores only pays), alternating, ``--inner`` times each; the table gives the median time of
each and the median of the paired ratios (target: at most 1.03). Usage:

    python perf/text_mcq_probe.py                       # CPU, T = 1k, 4k
    python perf/text_mcq_probe.py --device cuda --layers 28 --hidden 3584 --heads 28
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

TEXT = (
    "the river crosses a wide valley where farmers grow wheat and barley in long fields while "
    "small towns line the banks and old bridges carry roads from one side to the other"
)
WORDS = TEXT.split(" ")


def build_adapter(args: argparse.Namespace):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import posdebias
    from posdebias.testing.tiny.text import TEXT_FAMILIES, tiny_model

    _, tokenizer = tiny_model("qwen3")  # the toy tokenizer and Qwen3 chat template
    family = TEXT_FAMILIES["qwen3"]
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        head_dim=args.hidden // args.heads,
        eos_token_id=ids(family.eos),
        pad_token_id=ids(family.pad),
        **common.text_config_options(args),
    )
    model = Qwen3ForCausalLM(config).to(args.device, common.torch_dtype(args)).eval()
    return posdebias.get_adapter(model, tokenizer, label_set="upper")


def instance_of_length(adapter, tokens: int):
    """A 4-option question whose rendered prompt is about ``tokens`` tokens long."""
    from posdebias import Instance

    def make(words: int) -> Instance:
        texts = tuple(
            f"Option {k}: " + " ".join(WORDS[(k + i) % len(WORDS)] for i in range(words))
            for k in range(4)
        )
        return Instance(
            stem="Which passage describes the valley best?",
            texts=texts,
            target=1,
            id=f"t{tokens}",
            task="multiple_choice",
        )

    words = 8
    while True:  # grow the options until the prompt reaches the length
        instance = make(words)
        length = len(adapter.tokenizer(adapter.render(instance))["input_ids"])
        if length >= tokens:
            return instance, length
        words = max(words + 1, int(words * tokens / max(length, 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="text_mcq_probe.json")
    parser.add_argument("--tokens-list", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--inner", type=int, default=10, help="paired forwards per length")
    parser.set_defaults(layers=4, hidden=512, heads=8, kv_heads=2, dtype="float32")
    args, info = common.start(parser)
    adapter = build_adapter(args)
    rows, records = [], []
    for tokens in args.tokens_list:
        instance, length = instance_of_length(adapter, tokens)
        batch = adapter.prepare_batch([instance])
        spans = [len(span) for span in batch.spans[0]]
        adapter.run_batch(batch)  # warm-up, both paths
        adapter.run_batch(batch, attention=False)
        plain_times, probe_times, ratios = [], [], []
        for index in range(args.inner):
            order = (False, True) if index % 2 == 0 else (True, False)
            timed = {}
            for attention in order:
                seconds, _, _ = common.measure(
                    lambda a=attention, b=batch: adapter.run_batch(b, attention=a), args.device
                )
                timed[attention] = seconds
            plain_times.append(timed[False])
            probe_times.append(timed[True])
            ratios.append(timed[True] / timed[False])
        record = {
            "tokens": length,
            "span_tokens": spans,
            "sdpa_seconds": common.spread(plain_times),
            "probe_seconds": common.spread(probe_times),
            "paired_ratio": common.spread(ratios),
        }
        records.append(record)
        rows.append(
            [
                length,
                f"{min(spans)}-{max(spans)}",
                f"{statistics.median(plain_times):.4f}",
                f"{statistics.median(probe_times):.4f}",
                f"{record['paired_ratio']['median']:.3f} "
                f"({record['paired_ratio']['min']:.3f}-{record['paired_ratio']['max']:.3f})",
            ]
        )
        print(f"  T={length}: ratio {record['paired_ratio']['median']:.3f}", flush=True)
    table = common.print_table(
        f"Probe on text multiple choice (qwen3, {args.layers} layers, width {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads, {args.dtype}, {args.device}, "
        f"{args.inner} paired runs)",
        ["T", "option span tokens", "sdpa s", "probe s", "paired probe / sdpa (min-max)"],
        rows,
    )
    common.write_results("text_mcq_probe", args, info, records, table)


if __name__ == "__main__":
    main()
