"""Benchmark: per-instance cost of attention_guided vs vanilla at REAL model sizes (one GPU).

Random weights in the published configurations of Qwen2.5-VL-7B-Instruct, InternVL3-8B (-hf)
and LLaVA-OneVision-Qwen2-7B (written out below, no download), bfloat16, with the real Qwen
vocabulary (posdebias' test tokenizers) and images of the real token counts (256 per image for
Qwen2.5-VL at 448 px and InternVL at one 448 px tile, 729 for LLaVA-OneVision's 384 px tile).
For N = 4, 8, 12 it times one instance's prompt forward and label scoring:

* ``vanilla``: the label scores only (SDPA; and flash attention 2 where ``flash_attn`` is
  installed), what a method without attention pays;
* ``attention_guided``: the same forward with posdebias' attention probe recording;
* ``eager``: the authors' extraction, eager attention with ``output_attentions=True`` reduced
  to the same per-image masses.

and prints the time and peak-memory ratios next to the paper's Table 2 (attention_guided /
vanilla: 1.18x time and 1.03x memory at N = 4, 1.44x and 1.20x at N = 12). Methods alternate
inside each repetition. About 5 minutes on one H200 (three 7-8B models, built on the GPU).

    python perf/gpu_cost.py --device cuda                  # real sizes, one GPU
    python perf/gpu_cost.py --small --device cpu --repeats 2   # shrunk configs, CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

PAPER = {4: (1.18, 1.03), 12: (1.44, 1.20)}  # Table 2: attention_guided / vanilla (time, memory)
QWEN2_7B = {  # the Qwen2 / Qwen2.5 7B language model all three share
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
}
MODELS: dict[str, dict[str, Any]] = {
    "qwen2_5_vl": {  # Qwen/Qwen2.5-VL-7B-Instruct config.json
        "text": {**QWEN2_7B, "vocab_size": 152064, "max_position_embeddings": 128000},
        "rope": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
        "vision": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 3584,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "hidden_act": "silu",
        },
        "side": 448,  # 32 x 32 patches, merged 2 x 2: 256 tokens per image
    },
    "internvl": {  # OpenGVLab/InternVL3-8B-hf config.json
        "text": {**QWEN2_7B, "vocab_size": 151674, "rope_theta": 1e6},
        "vision": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": [448, 448],
            "patch_size": [14, 14],
            "norm_type": "layer_norm",
            "use_qk_norm": False,
            "layer_scale_init_value": 0.1,
            "hidden_act": "gelu",
        },
        "extra": {"downsample_ratio": 0.5, "projector_hidden_act": "gelu"},
        "side": 448,  # one 448 px tile: 1024 patches, pixel-shuffled by 0.5: 256 tokens
    },
    "llava_onevision": {  # llava-hf/llava-onevision-qwen2-7b-ov-hf config.json
        "text": {**QWEN2_7B, "vocab_size": 152128, "rope_theta": 1e6},
        "vision": {
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 26,
            "num_attention_heads": 16,
            "image_size": 384,
            "patch_size": 14,
        },
        "side": 384,  # one 384 px tile per image in multi-image prompts: 27 x 27 = 729 tokens
    },
}


def shrink(spec: dict[str, Any]) -> dict[str, Any]:
    """The same architecture at a CPU size: 2 layers, narrow, small images (--small)."""
    text = {
        **spec["text"],
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    vision = dict(spec["vision"])
    for key in ("depth", "num_hidden_layers"):
        if key in vision:
            vision[key] = 2
    vision.update({"hidden_size": 64, "num_heads" if "num_heads" in vision else
                   "num_attention_heads": 2})  # fmt: skip
    if "intermediate_size" in vision:
        vision["intermediate_size"] = 128
    if "out_hidden_size" in vision:
        vision["out_hidden_size"] = 128
    if "fullatt_block_indexes" in vision:
        vision["fullatt_block_indexes"] = [1]
        vision["window_size"] = 56
    side = {"qwen2_5_vl": 112, "internvl": 112, "llava_onevision": 112}
    small = {**spec, "text": text, "vision": vision}
    if "rope" in spec:
        small["rope"] = {**spec["rope"], "mrope_section": [4, 6, 6]}
    family = next(name for name, value in MODELS.items() if value is spec)
    small["side"] = side[family]
    if family == "internvl":
        small["vision"]["image_size"] = [112, 112]
    if family == "llava_onevision":
        small["vision"]["image_size"] = 112
    return small


def build(family: str, spec: dict[str, Any], args: argparse.Namespace) -> Any:
    """The posdebias adapter on a random-weight model of ``spec`` with its real processor
    layout and vocabulary, placed on the device in the benchmark dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from posdebias import get_adapter
    from posdebias.testing import tiny_model_and_processor

    _, processor = tiny_model_and_processor(family, real_vocabulary=True)
    tokenizer = processor.tokenizer
    ids = tokenizer.convert_tokens_to_ids
    side = spec["side"]
    text = {**spec["text"], "vocab_size": max(spec["text"]["vocab_size"], len(tokenizer))}
    text.update(eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"))
    if family == "qwen2_5_vl":
        from transformers.models.qwen2_vl import Qwen2VLImageProcessor

        processor.image_processor = Qwen2VLImageProcessor(
            size={"shortest_edge": side * side, "longest_edge": side * side}
        )
        config = AutoConfig.for_model(
            family,
            text_config={**text, "rope_parameters": spec["rope"]},
            vision_config=spec["vision"],
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
        )
    elif family == "internvl":
        from transformers.models.got_ocr2 import GotOcr2ImageProcessor

        tokens = (side // 14) ** 2 // 4
        processor.image_processor = GotOcr2ImageProcessor(
            size={"height": side, "width": side}, crop_to_patches=False, max_patches=1
        )
        processor.image_seq_length = tokens
        config = AutoConfig.for_model(
            family,
            text_config={"model_type": "qwen2", **text},
            vision_config=spec["vision"],
            image_token_id=ids("<IMG_CONTEXT>"),
            image_seq_length=tokens,
            **spec.get("extra", {}),
        )
    else:
        from transformers.models.llava_onevision import LlavaOnevisionImageProcessor

        pinpoints = [[side, side]]
        processor.image_processor = LlavaOnevisionImageProcessor(
            size={"height": side, "width": side}, image_grid_pinpoints=pinpoints
        )
        processor.num_image_tokens = (side // 14) ** 2
        config = AutoConfig.for_model(
            family,
            text_config={"model_type": "qwen2", **text},
            vision_config={"model_type": "siglip_vision_model", **spec["vision"]},
            image_token_index=ids("<image>"),
            video_token_index=ids("<video>"),
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            image_grid_pinpoints=pinpoints,
        )
    with torch.random.fork_rng(devices=[]), torch.device(args.device):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=common.torch_dtype(args))
    model.set_attn_implementation("sdpa")
    return get_adapter(model.eval(), processor)


def make_instances(count: int, n: int, side: int, directory: Path) -> list[Any]:
    """``count`` retrieval instances of N distinct noise images of ``side`` pixels."""
    from posdebias.core.instance import Instance
    from posdebias.testing import write_test_images

    files = write_test_images(directory, count * n, size=side)
    return [
        Instance(
            stem=f"a photo of object {index}",
            images=tuple(str(f) for f in files[index * n : (index + 1) * n]),
            target=index % n,
            id=f"bench-{index}",
        )
        for index in range(count)
    ]


def eager_masses(adapter: Any, batch: Any) -> Any:
    """The authors' extraction: eager attention maps of every layer, reduced to image masses."""
    import torch

    from posdebias.adapters.hf.spans import span_matrix

    length = batch.inputs["input_ids"].shape[1]
    spans = span_matrix(batch.spans, length).to(adapter.device)
    with torch.inference_mode():
        output = adapter.model_forward(
            **batch.inputs, position_ids=batch.position_ids, output_attentions=True
        )
        rows = [a[:, :, -1, :].float().mean(dim=1) for a in output.attentions]
        return torch.stack([torch.bmm(r[:, None, :], spans)[:, 0] for r in rows], 1).cpu()


def methods_for(adapter: Any) -> dict[str, Any]:
    """name -> one timed call on a prepared batch (the attention implementation switched in)."""
    from posdebias.adapters.attention import PROBE_NAME

    key = adapter.text_config_key

    def under(implementation: str, call: Any) -> Any:
        def run(batch: Any) -> Any:
            adapter.model.set_attn_implementation({key: implementation})
            try:
                return call(batch)
            finally:
                adapter.model.set_attn_implementation({key: PROBE_NAME})

        return run

    methods = {
        "vanilla": lambda b: adapter.run_batch(b, attention=False),
        "attention_guided": lambda b: adapter.run_batch(b, attention=True),
        "eager": under("eager", lambda b: eager_masses(adapter, b)),
    }
    if importlib.util.find_spec("flash_attn") is not None and adapter.device.type == "cuda":
        methods["vanilla_flash"] = under(
            "flash_attention_2", lambda b: adapter.run_batch(b, attention=False)
        )
    return methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, default_out="gpu_cost.json")
    parser.add_argument("--n-list", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--families", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--small", action="store_true", help="shrunk configs (2 layers, narrow): a CPU check"
    )
    args, info = common.start(parser)
    import torch

    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            spec = shrink(MODELS[family]) if args.small else MODELS[family]
            adapter = build(family, spec, args)
            methods = methods_for(adapter)
            names = list(methods)
            for n in args.n_list:
                instances = make_instances(
                    args.repeats + 1, n, spec["side"], Path(tmp) / f"{family}-{n}"
                )
                batches = [adapter.prepare_batch([instance]) for instance in instances]
                length = batches[0].inputs["input_ids"].shape[1]
                for name in names:  # warm-up
                    methods[name](batches[0])
                times: dict[str, list[float]] = {m: [] for m in names}
                peaks: dict[str, list[float]] = {m: [] for m in names}
                for repeat, batch in enumerate(batches[1:]):
                    shift = repeat % len(names)
                    for name in names[shift:] + names[:shift]:
                        seconds, peak, _ = common.measure(
                            lambda call=methods[name], b=batch: call(b), args.device
                        )
                        times[name].append(seconds)
                        peaks[name].append(peak)
                paper = PAPER.get(n)
                for name in names:
                    record = common.ratio_record(
                        times[name], peaks[name], times["vanilla"],
                        [max(peak, 1) for peak in peaks["vanilla"]],
                        family=family, n=n, tokens=length, method=name,
                        paper_time_ratio=paper[0] if paper and name == "attention_guided" else None,
                        paper_memory_ratio=paper[1] if paper and name == "attention_guided"
                        else None,
                    )  # fmt: skip
                    if record["peak_bytes"]["median"] < 2**20 or min(peaks["vanilla"]) < 2**20:
                        record["memory_ratio"] = None  # below the meter's resolution: no ratio
                    records.append(record)
                    cells = common.ratio_cells({**record, "memory_ratio": float("nan")})
                    if record["memory_ratio"] is not None:
                        cells = common.ratio_cells(record)
                    else:
                        cells[-1] = "n/a"
                    reference = (
                        f"{paper[0]:.2f} / {paper[1]:.2f}"
                        if paper and name == "attention_guided"
                        else ""
                    )
                    rows.append([family, n, length, name, *cells, reference])
                    print(f"  {family} N={n} {name}: x{record['time_ratio']:.3f}", flush=True)
            del adapter, methods  # free the model before the next one is built
            if args.device == "cuda":
                torch.cuda.empty_cache()
    size = "shrunk configs (--small)" if args.small else "real configs"
    table = common.print_table(
        f"Per instance, {size}, {args.dtype}, {args.device}, {args.repeats} instances per N",
        [
            "model",
            "N",
            "T",
            "method",
            "s/instance (min-max)",
            "time / vanilla",
            "peak MiB",
            "memory / vanilla",
            "paper time / memory",
        ],
        rows,
    )
    common.write_results("gpu_cost", args, info, records, table, small=args.small)


if __name__ == "__main__":
    main()
