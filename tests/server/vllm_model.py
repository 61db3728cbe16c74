"""The served model: a tiny random-weight Qwen3, a family posdebias has a built-in Hugging Face
adapter for (``qwen3``), so one folder is evaluated both through vLLM and through that adapter.

It is the project's own tiny Qwen3 (:mod:`posdebias.testing.tiny.text`: toy BPE tokenizer, the
checkpoints' chat-template layout) with head_dim 32, because vLLM's CPU attention needs
head_dim >= 32. The transformers reference below covers what a text adapter cannot pose: the
retrieval prompt with each image as placeholder text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_served_model(directory: Path, seed: int = 0) -> Path:
    """Write the tiny Qwen3 (float32 weights, tokenizer, chat template) to ``directory``."""
    import torch

    from posdebias.testing.tiny.text import tiny_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, tokenizer = tiny_model("qwen3", head_dim=32)
    directory.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def transformers_scores(served: Any, folder: Path, instances: list) -> list[Any]:
    """Label scores of ``instances`` posed exactly as the ``openai`` adapter ``served`` poses
    them (its messages and labels; no request is sent), from the transformers forward of the
    weights in ``folder`` with posdebias' restricted label scoring, one full forward per
    decoding step (no cache)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posdebias.adapters.hf.scoring import plan_labels, score_labels

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    for instance in instances:
        rendered = tokenizer.apply_chat_template(
            served.messages(instance), add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        labels = served.labels_for(instance.n)
        tokens = []
        for label in labels:
            full = tokenizer(rendered + label, add_special_tokens=False)["input_ids"]
            assert full[: len(prompt)] == prompt
            tokens.append(full[len(prompt) :])
        plan = plan_labels(tokens, tokenizer.eos_token_id, labels)

        def logits(prefix: tuple[int, ...], prompt: list[int] = prompt) -> torch.Tensor:
            with torch.inference_mode():
                return model(input_ids=torch.tensor([prompt + list(prefix)])).logits[:, -1, :]

        rows.append(score_labels(plan, logits(()), logits)[0].double().numpy())
    return rows
