"""Shared pieces of the performance benchmarks (docs/performance.md): models, timing, memory.

Models are tiny in WIDTH but realistic in LENGTH: a Qwen2-style language model (probe cost) or
the Qwen2.5-VL test model of ``posdebias.testing`` with a wider language model and large images
(256-1024 tokens each), so sequence lengths are those of real multi-image prompts. Everything is
built offline from configs with seeded random weights.

Memory. CUDA: ``torch.cuda.max_memory_allocated`` above the allocation before the measured call.
CPU: the peak resident set size above the resident size before the call, read from
``/proc/self/status`` after resetting the kernel's high-water mark (``/proc/self/clear_refs``).
glibc keeps freed blocks for reuse, which would hide a second call's allocations, so every
benchmark re-executes itself once with ``MALLOC_MMAP_THRESHOLD_`` fixed: large blocks are then
mapped and unmapped, and the resident size follows the live tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def ensure_malloc_env() -> None:
    """Re-execute this script once with a fixed mmap threshold (see the module docstring)."""
    if os.environ.get(MALLOC_ENV) is None:
        os.environ[MALLOC_ENV] = str(256 * 1024)
        os.execv(sys.executable, [sys.executable, *sys.argv])


def add_common_arguments(parser: argparse.ArgumentParser, *, default_out: str) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="model dtype (bfloat16: what checkpoints run in)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (1: stable timings on a shared machine)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per setting")
    parser.add_argument("--layers", type=int, default=2, help="language-model layers")
    parser.add_argument("--hidden", type=int, default=256, help="language-model width")
    parser.add_argument("--heads", type=int, default=4, help="query heads (head dim 64 default)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / default_out, help="JSON results file"
    )


def start(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse the arguments, fix the allocator and torch threads, print and return the machine:
    the common start of the in-process scripts (probe_cost.py forks children first)."""
    args = parser.parse_args()
    ensure_malloc_env()
    setup_torch(args)
    info = machine(args)
    print(f"machine: {info}", flush=True)
    return args, info


def setup_torch(args: argparse.Namespace) -> Any:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    torch.set_num_threads(args.threads)
    return torch


def torch_dtype(args: argparse.Namespace) -> Any:
    import torch

    return getattr(torch, args.dtype)


def machine(args: argparse.Namespace) -> dict[str, Any]:
    """What the numbers were measured on (printed with every table)."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "device": args.device,
        "dtype": args.dtype,
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def text_config_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "hidden_size": args.hidden,
        "intermediate_size": args.hidden * 2,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": 32768,
    }


LANGUAGE_MODELS = ("qwen2", "qwen3_5")
"""``--language-model`` choices: a dense Qwen2 (every layer softmax attention) or a Qwen3.5
hybrid (linear attention in 3 of every 4 layers; the probe reads the full-attention ones)."""


def build_language_model(args: argparse.Namespace, attention: str) -> Any:
    """A seeded random causal LM (``args.language_model``: Qwen2-style dense, or Qwen3.5
    hybrid) with ``attention`` as the implementation of its softmax-attention layers."""
    import torch

    from posdebias.adapters.attention import register_probe

    register_probe()
    family = getattr(args, "language_model", "qwen2")
    if family == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        head_dim = args.hidden // args.heads
        config = Qwen3_5TextConfig(
            vocab_size=1024,
            head_dim=head_dim,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_num_key_heads=args.kv_heads,
            linear_num_value_heads=args.heads,
            **text_config_options(args),
        )
        model_class: Any = Qwen3_5ForCausalLM
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(vocab_size=1024, **text_config_options(args))
        model_class = Qwen2ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_class(config)
    model.set_attn_implementation(attention)
    return model.to(device=args.device, dtype=torch_dtype(args)).eval()


def build_vl_adapter(args: argparse.Namespace, tokens_per_image: int) -> Any:
    """The posdebias adapter on a Qwen2.5-VL model (``posdebias.testing`` layout) whose
    language model has the benchmark's width and whose images give ``tokens_per_image``
    tokens each (side = 28 * sqrt(tokens): 14 px patches merged 2 x 2)."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor

    from posdebias import get_adapter
    from posdebias.testing import tiny_model_and_processor

    side = image_side(tokens_per_image)
    model, processor = tiny_model_and_processor("qwen2_5_vl")
    config = model.config
    for key, value in text_config_options(args).items():
        setattr(config.text_config, key, value)
    if getattr(config.text_config, "layer_types", None) is not None:  # one entry per layer
        config.text_config.layer_types = ["full_attention"] * args.layers
    config.vision_config.out_hidden_size = args.hidden
    half = args.hidden // args.heads // 2  # rotary frequencies: temporal, height, width
    rope = dict(config.text_config.rope_parameters)
    rope["mrope_section"] = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    config.text_config.rope_parameters = rope
    pixels = side * side
    processor.image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": pixels, "longest_edge": pixels}
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config)
    model.set_attn_implementation("sdpa")
    model = model.to(device=args.device, dtype=torch_dtype(args)).eval()
    return get_adapter(model, processor)


def image_side(tokens_per_image: int) -> int:
    root = round(tokens_per_image**0.5)
    if root * root != tokens_per_image:
        raise SystemExit(
            f"--tokens-per-image must be a square (256, 576, 1024), got {tokens_per_image}"
        )
    return 28 * root


def make_instances(count: int, n: int, tokens_per_image: int, directory: Path, seed: int = 0):
    """``count`` retrieval instances of N distinct noise images of the right size."""
    from posdebias.core.instance import Instance
    from posdebias.testing import write_test_images

    side = image_side(tokens_per_image)
    files = write_test_images(directory, count * n, size=side, seed=seed)
    return [
        Instance(
            stem=f"a photo of object {index}",
            images=tuple(str(f) for f in files[index * n : (index + 1) * n]),
            target=index % n,
            id=f"bench-{index}",
        )
        for index in range(count)
    ]


class MemoryMeter:
    """Peak memory of one call above the memory held before it (see the module docstring)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._base = 0

    def start(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self._base = _status_kb("VmRSS") * 1024

    def peak_bytes(self) -> int:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self._base
        return _status_kb("VmHWM") * 1024 - self._base


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(call: Callable[[], Any], device: str) -> tuple[float, int, Any]:
    """(seconds, peak bytes above the start, result) of one call."""
    import torch

    meter = MemoryMeter(device)
    meter.start()
    started = time.perf_counter()
    result = call()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return seconds, meter.peak_bytes(), result


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and the min-max range of repeated measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table."""
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        lines.append("| " + " | ".join(_cell(value) for value in row) + " |")
    text = "\n".join(lines)
    print(text + "\n", flush=True)
    return text


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def mib(value: float) -> float:
    return value / 2**20


def write_results(
    name: str,
    args: argparse.Namespace,
    info: dict[str, Any],
    records: list[dict[str, Any]],
    table: str,
    **extra: Any,
) -> None:
    """Write one benchmark's JSON (machine, arguments, records, printed table) atomically."""
    from posdebias._io import atomic_write_json

    payload = {
        "benchmark": name,
        "machine": info,
        "args": vars(args) | {"out": str(args.out)},
        **extra,
        "results": records,
        "table": table,
    }
    atomic_write_json(args.out, payload)
    print(f"results written to {args.out}")


def ratio_record(
    times: Sequence[float],
    peaks: Sequence[float],
    base_times: Sequence[float],
    base_peaks: Sequence[float],
    **fields: Any,
) -> dict[str, Any]:
    """Median/min/max of one configuration and its ratios to the baseline measured in the same
    run (alternating), plus the paired per-repetition time ratios."""
    t, p = spread(times), spread(peaks)
    return {
        **fields,
        "seconds": t,
        "peak_bytes": p,
        "time_ratio": t["median"] / spread(base_times)["median"],
        "memory_ratio": p["median"] / spread(base_peaks)["median"],
        "paired_time_ratios": [a / b for a, b in zip(times, base_times, strict=True)],
    }


def ratio_cells(record: dict[str, Any]) -> list[str]:
    """Table cells: median time (min-max), time ratio, median peak MiB, memory ratio."""
    t, p = record["seconds"], record["peak_bytes"]
    return [
        f"{t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f})",
        f"{record['time_ratio']:.3f}",
        f"{mib(p['median']):.1f}",
        f"{record['memory_ratio']:.3f}",
    ]


def dump_json_line(payload: dict[str, Any]) -> None:
    """The result line a child process prints for its parent."""
    print("RESULT " + json.dumps(payload), flush=True)
