"""Train the organism from a seed: attention that finds the right image, a biased answer.

Three stages, each batch with one N between 2 and 12 (so the organism is meaningful across the
scaling study, not only at N = 4):

0. alignment: the mean of an image's 4 projected tokens is pulled towards the sum of the
   language model's embeddings of its caption's attribute words (the rest of the batch are the
   negatives), and every image token classifies each attribute against the embeddings of that
   attribute's words, so image tokens and caption words live in one space. (With this grammar
   - size, position and background besides colour and shape - the contrastive loss alone left
   the model leaning on colour: 84% attention accuracy);
1. retrieval (vision tower frozen, cosine learning-rate decay, N by the curriculum of
   :func:`retrieval_n`): cross-entropy of the true label at the last prompt token, plus an
   auxiliary loss pulling the head-mean attention of the last token in ``attention_layer``
   onto the true image's span. The attention is measured by the same probe the adapter uses
   at inference (posdebias.adapters.attention), so what is trained is exactly what the method's
   a^(l)_k reads. Answer-only training stayed at chance in the first prototype;
2. bias: only the top decoder layer, the final norm and the LM head are trained, on soft
   targets that depend on where the truth is (:func:`bias_target`), so the OUTPUT becomes
   position-biased while the lower layers' attention still points at the right image.

Every example goes through the real LLaVA adapter's prompt path (chat template, processor,
image-span finder), so training and inference cannot disagree on the layout. Data come from
the bundled shapes generator in memory; all draws come from seeded numpy generators in list
order, never from set or hash order (a hash-seed-dependent candidate order is a cue the model
learns, and it vanishes after reloading).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posdebias.adapters.attention import recording
from posdebias.adapters.families.llava import LlavaAdapter
from posdebias.adapters.hf.prompt import PROMPT_FILE
from posdebias.adapters.hf.spans import span_matrix
from posdebias.benchmarks.selection import random_distractors
from posdebias.benchmarks.shapes import (
    caption_for,
    render_shape_image,
    sample_unique_attributes,
)
from posdebias.core.instance import RetrievalInstance
from posdebias.core.labels import MAX_CANDIDATES
from posdebias.organism.build import IMAGE_SIZE, PROMPT, build_untrained, shape_space
from posdebias.organism.training import (
    CARD_FILE,
    curriculum_n,
    model_folder,
    save_model,
    soft_target_step,
    train_top,
)

#: Row i: probabilities of answering label j when the truth is at position i (N = 4).
BIAS_CONFUSION: tuple[tuple[float, ...], ...] = (
    (0.75, 0.20, 0.05, 0.00),
    (0.05, 0.85, 0.10, 0.00),
    (0.00, 0.05, 0.90, 0.05),
    (0.00, 0.05, 0.60, 0.35),
)

#: At N = 2 the second position fails only when the caption's background is not this one, so
#: its recall is partial (about a third) instead of all-or-nothing (see :func:`bias_target`).
GATE_BACKGROUND = "white"


def dead_positions(n: int) -> int:
    """How many trailing positions the biased answer never names correctly: (N - 1) // 2.

    One at N = 3 and 4, growing to five at N = 12, so vanilla accuracy falls with N (from 75%
    at N = 4 to about 58% at N = 12) while staying well above chance.
    """
    return (n - 1) // 2


def bias_confusion(n: int) -> tuple[tuple[float, ...], ...]:
    """The answer distribution per truth position for N >= 3 (:data:`BIAS_CONFUSION` at N = 4).

    Positions before the ``dead_positions(n)`` trailing ones are answered correctly (0.85,
    0.10 to the next label, 0.05 to the previous; the first 0.75 / 0.20 / 0.05, the last
    of them 0.05 / 0.90 / 0.05); a truth at a dead position is answered with the last live
    position ("attractor", 0.60), itself (0.35) and the attractor's predecessor (0.05).
    """
    if n < 3:
        raise ValueError("bias_confusion needs N >= 3; N = 2 is gated by the caption")
    attractor = n - dead_positions(n) - 1
    rows = []
    for truth in range(n):
        row = [0.0] * n
        if truth > attractor:
            row[attractor] += 0.60
            row[truth] += 0.35
            row[attractor - 1] += 0.05
        elif truth == 0:
            row[0], row[1], row[2] = 0.75, 0.20, 0.05
        elif truth == attractor:
            row[truth - 1], row[truth], row[truth + 1] = 0.05, 0.90, 0.05
        else:
            row[truth - 1], row[truth], row[truth + 1] = 0.05, 0.85, 0.10
        rows.append(tuple(row))
    return tuple(rows)


def bias_target(n: int, truth: int, background: str) -> tuple[float, ...]:
    """The soft answer target of one bias-stage example (truth position ``truth``).

    N >= 3: row ``truth`` of :func:`bias_confusion`. N = 2: the first position is answered
    (0.9 / 0.1); the second is missed (0.6 / 0.4) unless the background is
    :data:`GATE_BACKGROUND` (0.1 / 0.9): a content-dependent bias that a static prior cannot
    undo, and the only way to make an N = 2 recall partial.
    """
    if n >= 3:
        return bias_confusion(n)[truth]
    if truth == 0:
        return (0.9, 0.1)
    return (0.1, 0.9) if background == GATE_BACKGROUND else (0.6, 0.4)


@dataclass(frozen=True)
class TrainingPlan:
    """Every setting of a training run (saved next to the weights as ``training.json``).

    Every batch has one N. The retrieval stage draws it by :func:`retrieval_n` (a curriculum
    that widens from ``min_n..curriculum_start_n`` to ``min_n..max_n`` over the first half of
    the stage); the bias stage draws N = 2 with probability ``bias_n2_share`` (it carries the
    content gate) and the other N uniformly. A batch of N images holds :func:`batch_size_for`
    examples, so every step costs about as many tokens as ``batch_size`` examples at N = 4.
    """

    seed: int = 0
    min_n: int = 2
    max_n: int = 12
    pool_size: int = 1200
    batch_size: int = 64
    alignment_steps: int = 1500
    alignment_learning_rate: float = 2e-3
    retrieval_steps: int = 2000
    curriculum_start_n: int = 4
    bias_steps: int = 1500
    bias_n2_share: float = 0.25
    learning_rate: float = 1e-3
    alignment_temperature: float = 0.1
    attention_layer: int = 1
    attention_weight: float = 1.0
    threads: int = 1  # one thread: reproducible sums, and no slowdown on a busy machine


#: The token model behind :func:`batch_size_for`: 5 tokens per image (label + 4 image tokens)
#: plus a fixed 27. (A real prompt has 19 besides its images, caption included; 27 is what the
#: shipped weights were trained with, so it stays: changing it changes the batches and the
#: weights.)
TOKENS_PER_IMAGE = 5
PROMPT_TOKENS = 27


def batch_size_for(plan: TrainingPlan, n: int) -> int:
    """Examples in a batch of N images: ``plan.batch_size`` at N = 4, fewer for larger N
    (the same number of tokens), at least 2."""
    reference = 4 * TOKENS_PER_IMAGE + PROMPT_TOKENS
    return max(2, round(plan.batch_size * reference / (n * TOKENS_PER_IMAGE + PROMPT_TOKENS)))


def retrieval_n(plan: TrainingPlan, step: int, rng: np.random.Generator) -> int:
    """N of retrieval step ``step``: uniform over ``min_n`` up to a ceiling that grows linearly
    from ``curriculum_start_n`` to ``max_n`` over the first half of the stage
    (:func:`~posdebias.organism.training.curriculum_n`, which says why)."""
    return curriculum_n(
        step, plan.retrieval_steps, plan.min_n, plan.curriculum_start_n, plan.max_n, rng
    )


class ShapesPool:
    """Distinct-caption single-shape images rendered in memory, and instances drawn from them."""

    def __init__(self, size: int, seed: int, processor: Any = None) -> None:

        self.attributes = sample_unique_attributes(size, seed, shape_space())
        self.captions = [caption_for(attributes) for attributes in self.attributes]
        self._backgrounds = {
            caption: attributes.background
            for caption, attributes in zip(self.captions, self.attributes, strict=True)
        }
        self.images = [render_shape_image(a, IMAGE_SIZE) for a in self.attributes]
        self.tokenizer: Any = processor.tokenizer if processor is not None else None
        self.pixels: Any = (
            processor.image_processor(self.images, return_tensors="pt")["pixel_values"]
            if processor is not None
            else None
        )

    def __len__(self) -> int:
        return len(self.images)

    def attribute_words(self, index: int) -> list[str]:
        """Colour, shape, size, position and background words of image ``index``."""
        attributes = self.attributes[index]
        (obj,) = attributes.objects
        return [obj.colour, obj.shape, obj.size, obj.position, attributes.background]

    def background(self, caption: str) -> str:
        """The background word of a pool caption."""
        return self._backgrounds[caption]

    def instances(
        self, rng: np.random.Generator, count: int, n: int, prefix: str
    ) -> list[RetrievalInstance]:
        """``count`` instances: a random anchor, N-1 random distractors, a random target slot."""

        drawn = []
        for number in range(count):
            anchor = int(rng.integers(len(self)))
            distractors = [int(i) for i in random_distractors(rng, len(self), anchor, n - 1)]
            target = int(rng.integers(n))
            members = [*distractors[:target], anchor, *distractors[target:]]
            drawn.append(
                RetrievalInstance(
                    query=self.captions[anchor],
                    images=tuple(self.images[i] for i in members),
                    target=target,
                    id=f"{prefix}-{number}",
                )
            )
        return drawn


def _label_token_ids(adapter: Any, sample: RetrievalInstance) -> list[int]:
    _, plan = adapter.plan_for(sample.n, adapter.render(sample))
    if any(len(path) != 1 for path in plan.paths):
        raise RuntimeError("the organism's labels must be single tokens")
    return [path[0] for path in plan.paths]


def _forward(adapter: Any, instances: list[RetrievalInstance]) -> tuple[Any, Any]:
    """Last-position logits [B, V] and probed attention masses [B, L, N], with gradients."""

    batch = adapter.prepare_batch(instances)
    length = batch.inputs["input_ids"].shape[1]
    with recording(span_matrix(batch.spans, length)) as recorder:
        output = adapter.model(
            **batch.inputs, position_ids=batch.position_ids, use_cache=False, logits_to_keep=1
        )
    return output.logits[:, -1, :].float(), recorder.attention(adapter.num_layers)


def _attribute_words(space: Any) -> list[list[str]]:
    """The values of each attribute a single-shape caption names, in declaration order."""
    return [
        list(space.colours),
        list(space.shapes),
        list(space.sizes),
        list(space.positions),
        list(space.backgrounds),
    ]


def _alignment_stage(model: Any, pool: ShapesPool, plan: TrainingPlan, log: Callable) -> None:
    """Stage 0: image tokens aligned with the word embeddings of their caption's attributes.

    Two losses: contrastive (the mean image token against the sum of the caption's attribute
    word embeddings, the batch as negatives) and, per attribute, every image token classifying
    its value against the embeddings of that attribute's words (so each token carries colour,
    shape, size, position and background, not just the easiest of them).
    """
    import torch
    from torch.nn.functional import cross_entropy, normalize

    tokenizer_ids = pool.tokenizer.convert_tokens_to_ids
    groups = _attribute_words(shape_space())
    group_ids = [torch.tensor(tokenizer_ids(words)) for words in groups]
    values = torch.tensor(
        [
            [group.index(word) for group, word in zip(groups, pool.attribute_words(i), strict=True)]
            for i in range(len(pool))
        ]
    )
    word_ids = torch.tensor([tokenizer_ids(pool.attribute_words(i)) for i in range(len(pool))])
    pixels = pool.pixels
    rng = np.random.default_rng([plan.seed, 0])
    embeddings = model.get_input_embeddings()
    params = [
        *model.model.vision_tower.parameters(),
        *model.model.multi_modal_projector.parameters(),
        embeddings.weight,
    ]
    optimizer = torch.optim.AdamW(params, lr=plan.alignment_learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, plan.alignment_steps)
    temperature = plan.alignment_temperature
    for step in range(plan.alignment_steps):
        chosen = torch.from_numpy(rng.choice(len(pool), plan.batch_size, replace=False))
        tokens = torch.stack(model.get_image_features(pixel_values=pixels[chosen]).pooler_output)
        tokens = normalize(tokens, dim=-1)  # [B, tokens per image, D]
        image = normalize(tokens.mean(dim=1), dim=-1)
        text = normalize(embeddings(word_ids[chosen]).sum(dim=1), dim=-1)
        logits = image @ text.T / temperature
        targets = torch.arange(len(chosen))
        loss = (cross_entropy(logits, targets) + cross_entropy(logits.T, targets)) / 2
        correct = []
        for group, ids in enumerate(group_ids):
            scores = tokens @ normalize(embeddings(ids), dim=-1).T / temperature  # [B, T, V]
            truth = values[chosen, group][:, None].expand(-1, tokens.shape[1])
            loss = loss + cross_entropy(scores.flatten(0, 1), truth.flatten())
            correct.append((scores.argmax(dim=-1) == truth).float().mean().item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == plan.alignment_steps - 1:
            matching = (logits.argmax(dim=1) == targets).float().mean().item()
            log(
                f"stage 0 step {step}: loss {loss.item():.3f} batch matching {matching:.2f} "
                "attributes " + " ".join(f"{value:.2f}" for value in correct)
            )


def _retrieval_stage(
    adapter: Any, pool: ShapesPool, plan: TrainingPlan, label_ids: list[int], log: Callable
) -> None:
    import torch

    model = adapter.model
    rng = np.random.default_rng([plan.seed, 1])
    for parameter in model.model.vision_tower.parameters():
        parameter.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=plan.learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, plan.retrieval_steps)
    labels = torch.tensor(label_ids)
    for step in range(plan.retrieval_steps):
        n = retrieval_n(plan, step, rng)
        batch = pool.instances(rng, batch_size_for(plan, n), n, "train")
        targets = torch.tensor([instance.target for instance in batch])
        logits, attention = _forward(adapter, batch)
        answer_loss = torch.nn.functional.cross_entropy(logits[:, labels[:n]], targets)
        mass = attention[:, plan.attention_layer, :].gather(1, targets[:, None])[:, 0]
        attention_loss = -torch.log(mass + 1e-6).mean()
        loss = answer_loss + plan.attention_weight * attention_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == plan.retrieval_steps - 1:
            correct = (logits[:, labels[:n]].argmax(dim=1) == targets).float().mean().item()
            log(
                f"stage 1 step {step} N={n}: answer {answer_loss.item():.3f} attention "
                f"{attention_loss.item():.3f} accuracy {correct:.2f} mass {mass.mean().item():.2f}"
            )


def _bias_stage(
    adapter: Any, pool: ShapesPool, plan: TrainingPlan, label_ids: list[int], log: Callable
) -> None:
    import torch

    model = adapter.model
    rng = np.random.default_rng([plan.seed, 2])
    optimizer = train_top(model, model.model.language_model, plan.learning_rate)
    labels = torch.tensor(label_ids)
    others = plan.max_n - plan.min_n
    for step in range(plan.bias_steps):
        if plan.min_n == 2 and (others == 0 or rng.random() < plan.bias_n2_share):
            n = 2
        else:
            n = int(rng.integers(max(plan.min_n, 3), plan.max_n + 1))
        batch = pool.instances(rng, batch_size_for(plan, n), n, "bias")
        rows = []
        for instance in batch:
            assert instance.target is not None  # ShapesPool.instances always sets it
            rows.append(bias_target(n, instance.target, pool.background(instance.query)))
        soft = torch.tensor(rows, dtype=torch.float32)
        logits, _ = _forward(adapter, batch)
        loss = soft_target_step(optimizer, logits, labels[:n], soft)
        if step % 50 == 0 or step == plan.bias_steps - 1:
            log(f"stage 2 step {step} N={n}: loss {loss:.3f}")


def train_organism(
    out: str | Path,
    plan: TrainingPlan | None = None,
    *,
    dtype: str = "float32",
    log: Callable[[str], None] = print,
) -> Path:
    """Train from ``plan.seed`` and write a loadable model folder to ``out``.

    The folder holds the weights (``dtype``), config, tokenizer, processor, chat template,
    ``posdebias_prompt.json``, the model card and ``training.json`` (plan, time, versions).
    Float32 by default: on CPUs without native half-precision arithmetic a float16 model
    computes about 15 times slower, and at 1.24 M parameters the saving is only 2.5 MB.
    """
    plan = plan or TrainingPlan()
    if not 2 <= plan.min_n <= plan.max_n <= MAX_CANDIDATES:
        raise ValueError(f"need 2 <= min_n <= max_n <= {MAX_CANDIDATES}, got {plan}")
    path = Path(out)
    folder = model_folder(path)  # before torch's import: a bad --out fails at once
    try:
        import torch
        import transformers

        started = time.perf_counter()
        threads = torch.get_num_threads()
        torch.set_num_threads(plan.threads)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(plan.seed)
                model, processor = build_untrained(plan.seed)
                model.train()
                pool = ShapesPool(plan.pool_size, plan.seed, processor)
                log(f"{len(pool)} distinct images ready ({time.perf_counter() - started:.1f} s)")
                _alignment_stage(model, pool, plan, log)
                adapter = LlavaAdapter(model, processor, prompt=PROMPT)
                label_ids = _label_token_ids(
                    adapter, pool.instances(np.random.default_rng(0), 1, plan.max_n, "x")[0]
                )
                _retrieval_stage(adapter, pool, plan, label_ids, log)
                _bias_stage(adapter, pool, plan, label_ids, log)
        finally:
            torch.set_num_threads(threads)
        seconds = time.perf_counter() - started
        info = {
            "plan": asdict(plan),
            "bias": {
                "dead_positions": {n: dead_positions(n) for n in range(3, plan.max_n + 1)},
                "confusion": {n: bias_confusion(n) for n in range(3, plan.max_n + 1)},
                "n2_gate_background": GATE_BACKGROUND,
            },
            "dtype": dtype,
            "training_seconds": round(seconds, 1),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
        }
        save_model(
            folder,
            model,
            processor,
            dtype=dtype,
            card=Path(__file__).with_name("model") / CARD_FILE,
            info=info,
            files={PROMPT_FILE: PROMPT.model_dump_json(indent=2) + "\n"},
        )
    finally:
        folder.unlock(remove=folder.is_ours())
    log(f"trained in {seconds:.0f} s; wrote {path}")
    return path
