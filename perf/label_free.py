"""Accuracy of calibration without labels (label_free) against labelled attention_guided.

For each of D calibration draws, M instances are drawn from a pool disjoint from the test set;
attention_guided is fitted on them WITH targets, label_free on the same M WITHOUT targets and on
4M unlabelled instances (the M plus 3M more). All are evaluated on the same test instances, each
in T seeded candidate orders (observed once, shared by every calibrator), as `posdebias evaluate`
does. Models: the bundled organism on its default benchmark (N = 4), the simulated model at N = 4
and 8, and (synthetic-4-weak) the simulated model with weak attention evidence, where the
label-free fit is expected to find the attention uninformative and fall back to PriDe.

    python perf/label_free.py                 # ~2 min on one CPU thread
    python perf/label_free.py --draws 10 --count 500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def without_target(instance):
    """The instance with its target hidden (what a user without labels has)."""
    from dataclasses import replace

    return replace(instance, target=None)


def evaluate_draws(adapter, pool, test, n, args, draws):
    """Accuracy (mean over orders) per calibrator label and draw."""
    import numpy as np

    from posdebias import get_calibrator
    from posdebias.evaluation.runner import (
        Evaluator,
        ObservationCache,
        fit_calibrators,
        summarize,
    )

    cache = ObservationCache()
    m = args.m
    accuracy: dict[str, list[float]] = {}
    diagnostics: dict[str, list[dict]] = {}
    for draw in range(draws):
        chosen = np.random.default_rng(draw).choice(len(pool), 4 * m, replace=False)
        calibration = [pool[i] for i in chosen]
        unlabelled = [without_target(x) for x in calibration]
        plans = {
            "vanilla": ("vanilla", calibration[:m]),
            f"pride (M={m}, labelled)": ("pride", calibration[:m]),
            f"attention_guided (M={m}, labelled)": ("attention_guided", calibration[:m]),
            f"attention_guided (M={4 * m}, labelled)": ("attention_guided", calibration),
            f"label_free (M={m}, unlabelled)": ("label_free", unlabelled[:m]),
            f"label_free (M={4 * m}, unlabelled)": ("label_free", unlabelled),
        }
        calibrators, states = {}, {}
        for label, (name, instances) in plans.items():
            calibrators[label] = get_calibrator(name)
            states[label] = fit_calibrators(
                adapter,
                {label: calibrators[label]},
                instances,
                batch_size=args.batch_size,
                cache=cache,
            )[label]
            if states[label].diagnostics:
                kept = {k: v for k, v in states[label].diagnostics.items() if k != "soft_targets"}
                soft = states[label].diagnostics.get("soft_targets")
                if soft is not None:  # did the fit find the truths it was not told?
                    truths = [x.target for x in calibration[: len(instances)]]
                    found = np.argmax(np.array(soft), axis=1) == truths
                    kept["truths_found"] = float(np.mean(found))
                diagnostics.setdefault(label, []).append(kept)
        evaluator = Evaluator(
            adapter,
            calibrators,
            states,
            orders=args.orders,
            seed=0,
            batch_size=args.batch_size,
            cache=cache,
        )
        metrics = summarize(evaluator.run(test), calibrators, n)
        for label, value in metrics.items():
            accuracy.setdefault(label, []).append(value.accuracy_mean)
    return accuracy, diagnostics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=5, help="labelled calibration instances M")
    parser.add_argument("--draws", type=int, default=5, help="calibration draws D")
    parser.add_argument("--count", type=int, default=200, help="test instances (organism)")
    parser.add_argument(
        "--synthetic-count", type=int, default=1000, help="test instances (simulated model)"
    )
    parser.add_argument(
        "--synthetic-draws", type=int, default=10, help="calibration draws (simulated model)"
    )
    parser.add_argument("--orders", type=int, default=5, help="candidate orders T")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models",
        nargs="+",
        default=["organism", "synthetic-4", "synthetic-8", "synthetic-4-weak"],
    )
    parser.add_argument(
        "--out", type=Path, default=common.RESULTS_DIR / "label_free.json", help="JSON results"
    )
    args = parser.parse_args()
    import statistics

    import torch

    torch.set_num_threads(args.threads)
    info = {"threads": args.threads, "torch": torch.__version__}
    rows, records = [], []
    for model in args.models:
        if model == "organism":
            from posdebias import load_adapter
            from posdebias.benchmarks.files import load_benchmark
            from posdebias.evaluation.job import split_held_out
            from posdebias.organism import MODEL_NAME
            from posdebias.organism.benchmark import bundled_benchmark

            n = 4
            adapter = load_adapter(MODEL_NAME)
            instances = load_benchmark(bundled_benchmark(n)).instances
            # the default run's test set: 5 held out by seed 0, the first --count of the rest
            held, rest = split_held_out(instances, 5, 0)
            test = rest[: args.count]
            pool = held + rest[args.count :]
        else:
            from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

            # synthetic-N, or synthetic-N-weak: attention evidence 0.5 instead of 1.5
            n = int(model.split("-")[1])
            weak = model.endswith("-weak")
            adapter = SyntheticAdapter(attention_evidence=0.5) if weak else SyntheticAdapter()
            test = synthetic_instances(args.synthetic_count, n, seed=0, prefix="test")
            pool = synthetic_instances(100, n, seed=1, prefix="cal")
        draws = args.draws if model == "organism" else args.synthetic_draws
        accuracy, diagnostics = evaluate_draws(adapter, pool, test, n, args, draws)
        labelled = accuracy[f"attention_guided (M={args.m}, labelled)"]
        for label, values in accuracy.items():
            mean = statistics.mean(values)
            gap = [a - b for a, b in zip(values, labelled, strict=True)]
            found = [d["truths_found"] for d in diagnostics.get(label, []) if "truths_found" in d]
            informative = [d["attention_informative"] for d in diagnostics.get(label, [])]
            record = {
                "model": model,
                "n": n,
                "test_instances": len(test),
                "draws": draws,
                "calibrator": label,
                "accuracy_per_draw": values,
                "accuracy_mean": mean,
                "accuracy_min": min(values),
                "difference_to_labelled_per_draw": gap,
                "diagnostics": diagnostics.get(label, []),
            }
            records.append(record)
            rows.append(
                [
                    model,
                    label,
                    f"{mean:.2f}",
                    f"{min(values):.2f}-{max(values):.2f}",
                    f"{statistics.mean(gap):+.2f}",
                    f"{min(gap):+.2f}",
                    f"{100 * statistics.mean(found):.0f}" if found else "",
                    f"{sum(informative)}/{len(informative)}" if informative else "",
                ]
            )
    table = common.print_table(
        f"Label-free calibration: accuracy %, mean over calibration draws ({args.draws} on the "
        f"organism with {args.count} test instances, {args.synthetic_draws} on the simulated "
        f"model with {args.synthetic_count}), each test instance in {args.orders} orders",
        [
            "model",
            "calibrator",
            "Acc (mean of draws)",
            "min-max",
            "vs labelled M",
            "worst draw",
            "truths found %",
            "attention informative",
        ],
        rows,
    )
    common.write_results("label_free", args, info, records, table)


if __name__ == "__main__":
    main()
