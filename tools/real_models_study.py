"""The real-model study of docs/real-models.md: observe, then measure the calibrators.

``observe``: load a GGUF model from the package index through posdebias (``load_adapter``), pose
WordNet questions (tools/wordnet_mcq.py) in all N cyclic orders and save every observation.
``report``: over R random draws of M calibration instances (the rest is the test set, in all
its orders), fit and apply posdebias's own calibrators on the saved observations and print the
mean accuracy of each, the share of draws whose layer choice was informative, and the per-layer
accuracy of the purified attention over all instances.

    python tools/real_models_study.py observe --model smollm2 --questions q.jsonl --out s.json
    python tools/real_models_study.py report s.json --draws 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def observe(model: str, questions: Path, out: Path, gguf_dir: Path) -> None:
    import torch

    from posdebias.core.instance import Instance
    from posdebias.loading import load_adapter
    from real_models import gemma3_gguf, smollm2_gguf

    torch.set_num_threads(1)
    path = smollm2_gguf() if model == "smollm2" else gemma3_gguf(gguf_dir)
    extra = {"chat_template": "raw"} if model == "gemma3" else {}
    adapter = load_adapter(str(path), label_set="upper", device="cpu", **extra)
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    records, start = [], time.perf_counter()
    for row in rows:
        instance = Instance(
            query=row["question"],
            texts=tuple(row["options"]),
            target=row["answer"] - 1,
            id=row["id"],
            task="multiple_choice",
        )
        views = [instance.rotated(shift) for shift in range(instance.n)]
        for obs in adapter.observe_many(views):
            records.append({"id": row["id"], **obs.to_dict()})
    seconds = (time.perf_counter() - start) / len(records)
    out.write_text(json.dumps({"model": model, "seconds_per_view": seconds, "views": records}))
    print(f"{len(records)} views, {seconds:.3f} s each -> {out}", file=sys.stderr)


CALIBRATORS = {
    "vanilla": ("vanilla", {}),
    "pride": ("pride", {}),
    "attention_readout": ("attention_readout", {}),
    "purified_attention": ("purified_attention", {}),
    "attention_guided": ("attention_guided", {}),
    "attention_guided (mean per token)": ("attention_guided", {"span_mass": "mean"}),
    "attention_guided (paper's mass selection)": ("attention_guided", {"layer_selection": "mass"}),
    "permutation_average": ("permutation_average", {}),
}


def report(path: Path, draws: int, sizes: list[int], seed: int) -> None:
    from posdebias import get_calibrator
    from posdebias.core.observation import Observation

    data = json.loads(path.read_text())
    by_id: dict[str, list[Observation]] = {}
    for record in data["views"]:
        by_id.setdefault(record["id"], []).append(Observation.from_dict(record))
    ids = list(by_id)
    n = by_id[ids[0]][0].n
    rng = np.random.default_rng(seed)
    print(
        f"{data['model']}: {len(ids)} questions x {n} orders, "
        f"{data['seconds_per_view']:.3f} s per forward"
    )
    for size in sizes:
        scores: dict[str, list[float]] = {label: [] for label in CALIBRATORS}
        informative = []
        for _ in range(draws):
            order = rng.permutation(len(ids))
            calibration = [o for i in order[:size] for o in by_id[ids[i]]]
            test = [ids[i] for i in order[size:]]
            for label, (name, options) in CALIBRATORS.items():
                calibrator = get_calibrator(name, **options)
                state = calibrator.fit(calibration)
                if label == "attention_guided":
                    informative.append(bool(state.layer_choice and state.layer_choice.informative))
                right = []
                for key in test:
                    views = by_id[key]
                    for view in views:
                        # rotations in the calibrator's own orders (the N cyclic shifts here)
                        shift = views.index(view)
                        rotations = [views[(shift + r) % n] for r in range(n)]
                        prediction = calibrator.predict(
                            view, state, rotations=rotations if calibrator.needs_rotations else None
                        )
                        right.append(prediction.choice == view.target)
                scores[label].append(100 * float(np.mean(right)))
        print(
            f"\nM = {size} calibration questions, {draws} draws "
            f"(attention informative in {100 * np.mean(informative):.0f}% of draws)"
        )
        print("| calibrator | Acc (mean over draws) | min | max |\n|---|---|---|---|")
        for label, values in scores.items():
            print(
                f"| {label} | {np.mean(values):.1f} | {np.min(values):.1f} | {np.max(values):.1f} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    obs = sub.add_parser("observe")
    obs.add_argument("--model", choices=("smollm2", "gemma3"), required=True)
    obs.add_argument("--questions", type=Path, required=True)
    obs.add_argument("--out", type=Path, required=True)
    obs.add_argument("--gguf-dir", type=Path, default=Path("/tmp/posdebias-gguf"))
    rep = sub.add_parser("report")
    rep.add_argument("observations", type=Path)
    rep.add_argument("--draws", type=int, default=20)
    rep.add_argument("--sizes", default="5,20")
    rep.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "observe":
        args.gguf_dir.mkdir(parents=True, exist_ok=True)
        observe(args.model, args.questions, args.out, args.gguf_dir)
    else:
        report(args.observations, args.draws, [int(s) for s in args.sizes.split(",")], args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
