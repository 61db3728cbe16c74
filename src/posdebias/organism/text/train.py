"""Train the text organism from a seed: attention on the right option, a position-biased answer.

Three stages; every batch has one N (2 to 6 options; the answer stage widens from N <= 4):

0. alignment (word embeddings only): each member word's embedding is classified among the
   embeddings of the eight category words (cosine / temperature), so that "fruit" and "pear"
   start out close. Without it, the attention on the right option had not formed after 300
   steps at N = 2 (a 50/50 split between the two options);
1. answer: cross-entropy of the right letter at the last prompt token, plus two attention
   losses, both supervised (the attention does not emerge on its own within the budget: with
   the answer loss alone it stayed at chance for 1,100 steps):

   * the head-mean attention of the last prompt token in ``attention_layer`` is pulled onto
     the right option's tokens (the option span the adapter reads, its label left out), so
     what is trained is exactly what the method's a^(l)_k reads;
   * one head (``label_head`` of layer ``label_layer``) is pulled, from every option token,
     onto that option's letter: the option's tokens then carry their letter, which the answer
     reads through the first loss's attention. (With the first loss alone the attention was
     right but the answer stayed at chance for 1,000 steps);

2. bias: only the top decoder layer, the final norm and the LM head are trained, on soft
   targets that depend on where the right option is (:func:`bias_target`), so the ANSWER
   becomes position-biased while the lower layers' attention still points at the right option.

Every example goes through the ``llama`` adapter's prompt path (the default multiple-choice
template, the chat template, text spans from the tokenizer's offsets), so training and
inference cannot disagree on the layout. The attention is read from the model's own eager
attention (the probe computes the same softmax at inference). Data come from
:func:`~posdebias.organism.text.world.draw_questions` with seeded generators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posdebias.adapters.families.text import LlamaAdapter
from posdebias.adapters.hf.spans import span_matrix
from posdebias.core.instance import Instance
from posdebias.organism.text.build import build_untrained
from posdebias.organism.text.world import CATEGORIES, draw_instances
from posdebias.organism.training import (
    CARD_FILE,
    curriculum_n,
    optimize,
    soft_target_step,
    train_model,
    train_top,
)

#: The most options the training poses (the letters A to L are scored at every step).
MAX_N = 12


def dead_positions(n: int) -> int:
    """How many trailing options the biased answer rarely names: max(1, (N - 1) // 2)."""
    return max(1, (n - 1) // 2)


def bias_target(n: int, truth: int) -> tuple[float, ...]:
    """The answer distribution the bias stage trains when the right option is at ``truth``.

    A primacy bias: a right option among the last :func:`dead_positions` is answered with the
    first letter (0.60), its own (0.35) or the one before it (0.05); an earlier right option is
    answered correctly (0.85; the first 0.90), with 0.10 to the first letter and 0.05 to the next
    one. At N = 4: ``[.90 .10 0 0]``, ``[.10 .85 .05 0]``, ``[.10 0 .85 .05]``,
    ``[.60 0 .05 .35]``.
    """
    row = [0.0] * n
    if truth >= n - dead_positions(n):
        row[0] += 0.60
        row[truth] += 0.35
        row[truth - 1] += 0.05
    elif truth == 0:
        row[0], row[1] = 0.90, 0.10
    else:
        row[truth] += 0.85
        row[0] += 0.10
        row[truth + 1] += 0.05
    return tuple(row)


@dataclass(frozen=True)
class TextTrainingPlan:
    """Every setting of a training run (saved next to the weights as ``training.json``)."""

    seed: int = 0
    min_n: int = 2
    max_n: int = 6
    curriculum_start_n: int = 4
    batch_size: int = 32
    alignment_steps: int = 300
    alignment_learning_rate: float = 1e-2
    alignment_temperature: float = 0.1
    answer_steps: int = 800
    learning_rate: float = 3e-3
    attention_layer: int = 1
    attention_weight: float = 1.0
    label_layer: int = 0
    label_head: int = 0
    label_weight: float = 1.0
    bias_steps: int = 600
    bias_learning_rate: float = 1e-3
    threads: int = 1  # one thread: reproducible sums, and no slowdown on a busy machine


@dataclass
class _Trainer:
    """The model, its adapter (the prompt path) and the letters' token ids."""

    model: Any
    adapter: Any
    letters: Any  # [max_n] token ids of A, B, ...
    plan: TextTrainingPlan

    def forward(self, questions: list[Instance]) -> tuple[Any, Any, Any]:
        """Last-position logits [B, V], the last token's head-mean attention mass on each
        option [B, L, N], and the label head's attention from every option token to its
        letter [tokens]."""
        import torch

        batch = self.adapter.prepare_batch(questions)
        ids = batch.inputs["input_ids"]
        output = self.model(
            **batch.inputs,
            position_ids=batch.position_ids,
            use_cache=False,
            output_attentions=True,
        )
        spans = span_matrix(batch.spans, ids.shape[1])  # [B, T, N]
        last = torch.stack([layer[:, :, -1, :].mean(dim=1) for layer in output.attentions], 1)
        masses = torch.einsum("blt,btn->bln", last, spans)
        head = output.attentions[self.plan.label_layer][:, self.plan.label_head]  # [B, T, T]
        rows, tokens, letters = [], [], []
        letter_ids = set(self.letters.tolist())
        for row, row_spans in enumerate(batch.spans):
            row_ids = ids[row].tolist()
            for span in row_spans:
                positions = span.positions()
                letter = max(t for t in range(positions[0]) if row_ids[t] in letter_ids)
                rows += [row] * len(positions)
                tokens += positions
                letters += [letter] * len(positions)
        on_letter = head[torch.tensor(rows), torch.tensor(tokens), torch.tensor(letters)]
        return output.logits[:, -1, :].float(), masses, on_letter


def _alignment_stage(trainer: _Trainer, log: Callable[[str], None]) -> None:
    """Stage 0: member words' embeddings classified among the category words' embeddings."""
    import torch
    from torch.nn.functional import cross_entropy, normalize

    plan = trainer.plan
    ids = trainer.adapter.tokenizer.convert_tokens_to_ids
    names = list(CATEGORIES)
    category_ids = torch.tensor(ids(names))
    member_ids = torch.tensor([ids(word) for name in names for word in CATEGORIES[name]])
    kinds = torch.tensor([k for k, name in enumerate(names) for _ in CATEGORIES[name]])
    embeddings = trainer.model.get_input_embeddings()
    optimizer = torch.optim.AdamW([embeddings.weight], lr=plan.alignment_learning_rate)
    for step in range(plan.alignment_steps):
        weights = normalize(embeddings.weight, dim=-1)
        logits = weights[member_ids] @ weights[category_ids].T / plan.alignment_temperature
        loss = cross_entropy(logits, kinds)
        optimize(optimizer, loss)
        if step % 50 == 0 or step == plan.alignment_steps - 1:
            right = (logits.argmax(dim=1) == kinds).float().mean().item()
            log(f"stage 0 step {step}: loss {loss.item():.3f} words in their category {right:.2f}")


def _answer_stage(trainer: _Trainer, log: Callable[[str], None]) -> None:
    """Stage 1: the answer, the last token's attention and the label head (module docstring)."""
    import torch

    plan = trainer.plan
    rng = np.random.default_rng([plan.seed, 1])
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=plan.learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, plan.answer_steps)
    for step in range(plan.answer_steps):
        n = curriculum_n(
            step, plan.answer_steps, plan.min_n, plan.curriculum_start_n, plan.max_n, rng
        )
        batch = draw_instances(rng, plan.batch_size, n, "train")
        targets = torch.tensor([question.target for question in batch], dtype=torch.long)
        logits, masses, on_letter = trainer.forward(batch)
        answer_loss = torch.nn.functional.cross_entropy(logits[:, trainer.letters[:n]], targets)
        mass = masses[:, plan.attention_layer, :].gather(1, targets[:, None])[:, 0]
        attention_loss = -torch.log(mass + 1e-6).mean()
        label_loss = -torch.log(on_letter + 1e-6).mean()
        loss = answer_loss + plan.attention_weight * attention_loss + plan.label_weight * label_loss
        optimize(optimizer, loss, schedule)
        if step % 50 == 0 or step == plan.answer_steps - 1:
            right = (logits[:, trainer.letters[:n]].argmax(dim=1) == targets).float().mean()
            log(
                f"stage 1 step {step} N={n}: answer {answer_loss.item():.3f} accuracy "
                f"{right.item():.2f} attention on the right option {mass.mean().item():.2f} "
                f"label head {on_letter.mean().item():.2f}"
            )


def _bias_stage(trainer: _Trainer, log: Callable[[str], None]) -> None:
    """Stage 2: the top layer, final norm and LM head learn the position-biased answer."""
    import torch

    plan = trainer.plan
    model = trainer.model
    rng = np.random.default_rng([plan.seed, 2])
    optimizer = train_top(model, model.model, plan.bias_learning_rate)
    for step in range(plan.bias_steps):
        n = int(rng.integers(plan.min_n, plan.max_n + 1))
        batch = draw_instances(rng, plan.batch_size, n, "bias")
        rows = [bias_target(n, question.target or 0) for question in batch]
        soft = torch.tensor(rows, dtype=torch.float32)
        logits, _, _ = trainer.forward(batch)
        loss = soft_target_step(optimizer, logits, trainer.letters[:n], soft)
        if step % 50 == 0 or step == plan.bias_steps - 1:
            log(f"stage 2 step {step} N={n}: loss {loss:.3f}")


def train_text_organism(
    out: str | Path,
    plan: TextTrainingPlan | None = None,
    *,
    dtype: str = "float32",
    log: Callable[[str], None] = print,
) -> Path:
    """Train from ``plan.seed`` and write a loadable model folder to ``out``: the weights
    (``dtype``), config, tokenizer with its chat template, the model card and
    ``training.json`` (plan, bias, time, versions)."""
    plan = plan or TextTrainingPlan()
    if not 2 <= plan.min_n <= plan.curriculum_start_n <= plan.max_n <= MAX_N:
        raise ValueError(f"need 2 <= min_n <= curriculum_start_n <= max_n <= {MAX_N}, got {plan}")

    def train() -> tuple[Any, Any, dict[str, Any]]:
        import torch

        model, tokenizer = build_untrained(plan.seed)
        model.train()
        adapter = LlamaAdapter(model, tokenizer, label_set="upper")
        model.set_attn_implementation("eager")  # the adapter installed its probe
        letters = torch.tensor(
            [tokenizer.convert_tokens_to_ids(letter) for letter in adapter.labels_for(MAX_N)]
        )
        trainer = _Trainer(model=model, adapter=adapter, letters=letters, plan=plan)
        _alignment_stage(trainer, log)
        _answer_stage(trainer, log)
        _bias_stage(trainer, log)
        bias = {
            "dead_positions": {n: dead_positions(n) for n in range(2, plan.max_n + 1)},
            "targets": {
                n: [bias_target(n, truth) for truth in range(n)] for n in range(2, plan.max_n + 1)
            },
        }
        return model, tokenizer, {"plan": asdict(plan), "bias": bias}

    card = Path(__file__).with_name("model") / CARD_FILE
    return train_model(out, plan.seed, plan.threads, train, dtype=dtype, card=card, log=log)
