"""Golden metrics of the seeded default runs: compare (the tests) or regenerate (this command).

Seeded runs are byte-reproducible, so their metrics are pinned exactly instead of checked
against threshold bands. After a deliberate change of the numbers (a retrained organism, a new
order sampling, a fixed bug), regenerate the files and commit them with the change:

    make goldens          # = python tests/golden.py --regenerate (from the repository root)

Each file holds, per calibrator, Acc (mean and std over the orders), RStd, Cons. and the
selection-rate matrix of the run named in it, and the run's statistics: the 95% bootstrap
intervals, position views and paired comparisons (seeded, so pinned exactly too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent / "goldens"

#: name -> the `posdebias evaluate` arguments of the run: the simulated model's default run,
#: the organism's default run on its first 60 test instances x 2 orders (the full one takes
#: minutes on a busy CI machine; same model, benchmark, calibration and seed), the organism
#: at N = 2 and N = 12, the ends of the scaling study, and the text organism's default run
#: (`--task multiple_choice`) on 60 questions x 2 orders, and with the cloze rows.
RUNS: dict[str, list[str]] = {
    "simulated_default": ["--adapter", "synthetic"],
    "organism_default": ["--count", "60", "--orders", "2"],
    "organism_n2": ["-N", "2", "--count", "60", "--orders", "2"],
    "organism_n12": ["-N", "12", "--count", "40", "--orders", "2"],
    "text_organism_default": ["--task", "multiple_choice", "--count", "60", "--orders", "2"],
    # real pretrained weights from GGUF files of the package index (tests/real_models.py) on 45
    # WordNet capitals questions (20 of them calibrate, the default M) x 2 orders
    "real_smollm2": ["--model", "{smollm2}", "--benchmark", "{capitals}", "--orders", "2"],
    "real_gemma3": [
        "--model", "{gemma3}", "--chat-template", "raw", "--benchmark", "{capitals}",
        "--orders", "2",
    ],
    "text_organism_cloze": ["--task", "multiple_choice", "--count", "60", "--orders", "2",
                            "--calibrators", "vanilla,permutation_average",
                            "--decoders", "cloze,cloze_mean"],
}  # fmt: skip

#: Placeholders of the real runs, made in a scratch folder by :func:`real_inputs`.
REAL_INPUTS = ("{smollm2}", "{gemma3}", "{capitals}")


def real_inputs(args: list[str], scratch: Path, files: dict[str, str] | None = None) -> list[str]:
    """``args`` with the real runs' placeholders replaced by the GGUF files (``files``: those
    already at hand, by model name) and a benchmark of WordNet questions (built once per
    scratch folder)."""
    if not any(arg in REAL_INPUTS for arg in args):
        return args
    from real_models import gemma3_gguf, smollm2_gguf, wordnet_benchmark

    files = files or {}
    paths = {
        "{smollm2}": lambda: files.get("smollm2") or smollm2_gguf(),
        "{gemma3}": lambda: files.get("gemma3") or gemma3_gguf(scratch),
    }
    capitals = scratch / "capitals"
    if not capitals.exists():
        wordnet_benchmark("capitals", 45, 4, 0, capitals)
    paths["{capitals}"] = lambda: capitals
    return [str(paths[arg]()) if arg in paths else arg for arg in args]


def run_metrics(
    args: list[str], scratch: Path | None = None, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """The metrics of one CLI run, as the golden files store them (``scratch``: where the real
    runs' inputs are made, ``files``: GGUF files at hand; the run is recorded with its
    placeholders)."""
    from posdebias.evaluation.config import load_config
    from posdebias.evaluation.job import run_evaluation

    resolved = args if scratch is None else real_inputs(args, scratch, files)
    flags = dict(zip(resolved[::2], resolved[1::2], strict=True))
    options = {"chat_template": flags["--chat-template"]} if "--chat-template" in flags else {}
    config = load_config(
        None,
        adapter={"name": flags.get("--adapter"), "options": options}
        if options
        else flags.get("--adapter"),
        model=flags.get("--model"),
        benchmark=flags.get("--benchmark"),
        task=flags.get("--task"),
        n=int(flags["-N"]) if "-N" in flags else None,
        count=int(flags["--count"]) if "--count" in flags else None,
        orders=int(flags["--orders"]) if "--orders" in flags else None,
        calibrators=flags.get("--calibrators"),
        decoders=flags.get("--decoders"),
    )
    results = run_evaluation(config)  # a bundled model's thread count is applied inside
    assert results is not None
    return {
        "run": ["posdebias", "evaluate", *args],
        "n": results.n,
        "orders": results.orders,
        "num_instances": results.num_instances,
        "metrics": {
            label: result.metrics.model_dump(mode="json")
            for label, result in results.calibrators.items()
        },
        "statistics": None
        if results.statistics is None
        else results.statistics.model_dump(mode="json"),
    }


def path_of(name: str) -> Path:
    return FOLDER / f"{name}.json"


def regenerate(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as cache:
        os.environ.setdefault("POSDEBIAS_CACHE_DIR", cache)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        for name in names:
            data = run_metrics(RUNS[name], Path(cache))
            path_of(name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            print(f"wrote {path_of(name)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/golden.py", description=__doc__)
    parser.add_argument("--regenerate", action="store_true", help="rewrite the golden files")
    parser.add_argument(
        "names", nargs="*", help=f"runs to regenerate (default: all of {list(RUNS)})"
    )
    args = parser.parse_args(argv)
    if not args.regenerate:
        parser.error("nothing to do: pass --regenerate (the tests compare against the files)")
    regenerate(args.names or list(RUNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
