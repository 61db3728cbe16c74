"""Train the organism from a seed: confounded but informative attention, a biased answer.

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
   auxiliary loss pulling the head-mean attention of the last token in ``attention_layers``
   toward :func:`attention_target`: a distribution that is NOT the truth but what the paper
   describes in real models, content evidence (graded by how many caption attributes each
   image shares) times a static positional sink (:func:`sink_position`) and, in the confound
   stage that follows, times a salient colour (red shapes draw attention whatever the caption
   says: a confound that no positional prior removes, so only the answer's evidence can
   correct it, which is what the method's bias profile brings). The attention is
   measured by the same probe the adapter uses at inference (posdebias.adapters.attention), so
   what is trained is exactly what the method's a^(l)_k reads. (Answer-only training left the
   attention at chance in a short prototype; it did not emerge within the budget);
2. bias: only the top decoder layer, the final norm and the LM head are trained, on soft
   targets that depend on where the truth is (:func:`bias_target`), so the OUTPUT becomes
   position-biased while the lower layers' attention is unchanged.

Every example goes through the real LLaVA adapter's prompt path (chat template, processor,
image-span finder), so training and inference cannot disagree on the layout. Data come from
the bundled shapes generator in memory; all draws come from seeded numpy generators in list
order, never from set or hash order (a hash-seed-dependent candidate order is a cue the model
learns, and it vanishes after reloading).
"""

from __future__ import annotations

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
from posdebias.core.instance import Instance
from posdebias.core.labels import MAX_CANDIDATES
from posdebias.organism.build import IMAGE_SIZE, PROMPT, build_untrained, shape_space
from posdebias.organism.training import (
    CARD_FILE,
    curriculum_n,
    optimize,
    soft_target_step,
    train_model,
    train_top,
)

#: Row i: probabilities of answering label j when the truth is at position i (N = 4). A truth
#: in the last position is answered exactly as one in the position before it.
BIAS_CONFUSION: tuple[tuple[float, ...], ...] = (
    (0.75, 0.20, 0.05, 0.00),
    (0.05, 0.85, 0.10, 0.00),
    (0.00, 0.05, 0.90, 0.05),
    (0.00, 0.05, 0.90, 0.05),
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
    of them 0.05 / 0.90 / 0.05); a truth at a dead position is answered as one at the last
    live position ("attractor", 0.90; its predecessor 0.05) and names itself with only 0.05.
    So the answer alone cannot tell a dead truth from the attractor, and one static prior per
    label (PriDe) cannot undo it: only evidence of where the truth is can.
    """
    if n < 3:
        raise ValueError("bias_confusion needs N >= 3; N = 2 is gated by the caption")
    attractor = n - dead_positions(n) - 1
    rows = []
    for truth in range(n):
        row = [0.0] * n
        if truth > attractor:
            row[attractor] += 0.90
            row[truth] += 0.05
            row[attractor - 1] += 0.05
        elif truth == 0:
            row[0], row[1], row[2] = 0.75, 0.20, 0.05
        elif truth == attractor:
            row[truth - 1], row[truth], row[truth + 1] = 0.05, 0.90, 0.05
        else:
            row[truth - 1], row[truth], row[truth + 1] = 0.05, 0.85, 0.10
        rows.append(tuple(row))
    return tuple(rows)


def bias_target(n: int, truth: int, background: str, smoothing: float = 0.0) -> tuple[float, ...]:
    """The soft answer target of one bias-stage example (truth position ``truth``).

    N >= 3: row ``truth`` of :func:`bias_confusion`, mixed with ``smoothing`` of the uniform
    distribution (so no label is ever ruled out: with zeros, the largest gap between a row's
    diagonal and its other entries, the method's visual gain, is so large that the corrected
    score follows the attention alone, and the answer's evidence is never used). N = 2: the
    first position is answered (0.9 / 0.1); the second is missed (0.6 / 0.4) unless the
    background is :data:`GATE_BACKGROUND` (0.1 / 0.9): a content-dependent bias that a static
    prior cannot undo, and the only way to make an N = 2 recall partial.
    """
    if n >= 3:
        return tuple((1 - smoothing) * p + smoothing / n for p in bias_confusion(n)[truth])
    if truth == 0:
        return (0.9, 0.1)
    return (0.1, 0.9) if background == GATE_BACKGROUND else (0.6, 0.4)


def sink_position(n: int) -> int:
    """The image the trained attention favours whatever it shows: the second to last (the first
    at N = 2), always the same distance before the answer, like a positional attention sink."""
    return max(0, n - 2)


def attention_target(
    matches: tuple[int, ...],
    sink_strength: float,
    content_strength: float,
    salient: tuple[bool, ...] | None = None,
    saliency_strength: float = 0.0,
) -> tuple[float, ...]:
    """The distribution over the N images that the attention stages train attention toward.

    ``matches[k]``: how many of the caption's five attributes image k has (5 for the right
    image). Logits ``content_strength * matches[k]``, plus ``saliency_strength`` for each
    image flagged in ``salient`` (one colour draws the eye whatever the caption says), plus
    ``sink_strength`` at :func:`sink_position`: the content evidence points at the right image
    more often than not, but an image in the sink position that shares two or more attributes
    with the caption draws as much mass as the right one (or more), and so does a salient one.
    Dividing by the attention averaged over positions (the method's static prior) removes the
    sink, not the content and not the saliency: that is left to the answer's evidence.
    """
    logits = content_strength * np.asarray(matches, dtype=float)
    if salient is not None:
        logits = logits + saliency_strength * np.asarray(salient, dtype=float)
    logits[sink_position(len(matches))] += sink_strength
    weights = np.exp(logits - logits.max())
    return tuple(float(w) for w in weights / weights.sum())


@dataclass(frozen=True)
class TrainingPlan:
    """Every setting of a training run (saved next to the weights as ``training.json``).

    Every batch has one N. The retrieval stage draws it by :func:`retrieval_n` (a curriculum
    that widens from ``min_n..curriculum_start_n`` to ``min_n..max_n`` over the first half of
    the stage), the confound stage uniformly; the bias stage draws N = 2 with probability
    ``bias_n2_share`` (it carries the content gate) and the other N uniformly. A batch of N
    images holds :func:`batch_size_for` examples, so every step costs about as many tokens as
    ``batch_size`` examples at N = 4.

    The attention target (:func:`attention_target`) has ``content_strength`` per shared
    attribute and a sink of ``retrieval_sink_strength`` (weight ``retrieval_attention_weight``)
    in the retrieval stage, ``sink_strength`` (weight ``attention_weight``) in the confound
    stage. Why two: with the full sink and weight from the first step, neither the answer nor
    the content part of the attention had moved off chance after 500 steps; with the mild
    ones the answer is learned, but it pulls the supervised layers toward the right image, so
    their raw attention stayed nearly as good as the purified one (96 vs 97% at N = 4).

    The confound stage also adds ``saliency_strength`` to every image whose shape has
    ``salient_colour``. Why: with the sink alone, dividing by the static prior left nothing for
    the bias profile to correct (purified attention 97.7, the full method 97.6 at N = 4); a
    content-dependent confound survives purification (a red distractor outweighs the right
    image when it shares two or more of the caption's attributes), and the answer, trained on
    the truth, still knows better: 3.75 puts purified attention 2.5 points below the method at
    N = 4 (93.2 vs 95.7), with 3.5 and 4.0 tried (1.7 and 3.5 points; the method 96.3, 95.4).
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
    confound_steps: int = 600
    bias_steps: int = 1000
    bias_n2_share: float = 0.25
    bias_smoothing: float = 0.2
    learning_rate: float = 1e-3
    confound_learning_rate: float = 5e-4
    alignment_temperature: float = 0.1
    attention_layers: tuple[int, ...] = (1, 2)
    content_strength: float = 1.0
    retrieval_sink_strength: float = 3.0
    retrieval_attention_weight: float = 1.0
    sink_strength: float = 4.0
    salient_colour: str = "red"
    saliency_strength: float = 3.75
    attention_weight: float = 5.0
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

    def matches(self, anchor: int, members: list[int]) -> tuple[int, ...]:
        """For each member image, how many of the anchor's caption attributes it has."""
        words = self.attribute_words(anchor)
        return tuple(
            sum(a == b for a, b in zip(self.attribute_words(i), words, strict=True))
            for i in members
        )

    def salient(self, members: list[int], colour: str) -> tuple[bool, ...]:
        """For each member image, whether its shape has ``colour``."""
        return tuple(self.attribute_words(i)[0] == colour for i in members)

    def draw(
        self, rng: np.random.Generator, count: int, n: int
    ) -> list[tuple[int, list[int], int]]:
        """``count`` draws of (anchor, member images in order, target slot): a random anchor,
        N-1 random distractors, a random target slot."""
        drawn = []
        for _ in range(count):
            anchor = int(rng.integers(len(self)))
            distractors = [int(i) for i in random_distractors(rng, len(self), anchor, n - 1)]
            target = int(rng.integers(n))
            drawn.append((anchor, [*distractors[:target], anchor, *distractors[target:]], target))
        return drawn

    def instance(self, anchor: int, members: list[int], target: int, id: str) -> Instance:
        return Instance(
            stem=self.captions[anchor],
            images=tuple(self.images[i] for i in members),
            target=target,
            id=id,
        )

    def instances(
        self, rng: np.random.Generator, count: int, n: int, prefix: str
    ) -> list[Instance]:
        """``count`` instances of :meth:`draw`."""
        return [
            self.instance(anchor, members, target, f"{prefix}-{number}")
            for number, (anchor, members, target) in enumerate(self.draw(rng, count, n))
        ]


def _label_token_ids(adapter: Any, sample: Instance) -> list[int]:
    _, plan = adapter.plan_for(sample.n, adapter.render(sample))
    if any(len(path) != 1 for path in plan.paths):
        raise RuntimeError("the organism's labels must be single tokens")
    return [path[0] for path in plan.paths]


def _forward(adapter: Any, instances: list[Instance]) -> tuple[Any, Any]:
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
        optimize(optimizer, loss, schedule)
        if step % 50 == 0 or step == plan.alignment_steps - 1:
            matching = (logits.argmax(dim=1) == targets).float().mean().item()
            log(
                f"stage 0 step {step}: loss {loss.item():.3f} batch matching {matching:.2f} "
                "attributes " + " ".join(f"{value:.2f}" for value in correct)
            )


@dataclass(frozen=True)
class _AttentionPhase:
    """One attention-supervised stage: its name in the log, steps, learning rate, target and
    loss weight, its random stream and how it draws N (a step and the stream give N)."""

    stage: str
    steps: int
    learning_rate: float
    sink_strength: float
    saliency_strength: float
    attention_weight: float
    stream: int
    draw_n: Callable[[int, np.random.Generator], int]


def _attention_phases(plan: TrainingPlan) -> tuple[_AttentionPhase, _AttentionPhase]:
    """Retrieval (the curriculum over N, a mild sink, the answer first) and confound (every N,
    the full sink and the salient colour, the attention target weighted up so that it wins
    over the answer's pull toward the right image in the supervised layers)."""
    return (
        _AttentionPhase(
            stage="1",
            steps=plan.retrieval_steps,
            learning_rate=plan.learning_rate,
            sink_strength=plan.retrieval_sink_strength,
            saliency_strength=0.0,
            attention_weight=plan.retrieval_attention_weight,
            stream=1,
            draw_n=lambda step, rng: retrieval_n(plan, step, rng),
        ),
        _AttentionPhase(
            stage="1b",
            steps=plan.confound_steps,
            learning_rate=plan.confound_learning_rate,
            sink_strength=plan.sink_strength,
            saliency_strength=plan.saliency_strength,
            attention_weight=plan.attention_weight,
            stream=3,
            draw_n=lambda step, rng: int(rng.integers(plan.min_n, plan.max_n + 1)),
        ),
    )


def _attention_stage(
    adapter: Any,
    pool: ShapesPool,
    plan: TrainingPlan,
    phase: _AttentionPhase,
    label_ids: list[int],
    log: Callable,
) -> None:
    """Cross-entropy of the true label plus ``phase.attention_weight`` times the cross-entropy
    of the supervised layers' image masses against :func:`attention_target` (vision tower
    frozen, cosine learning-rate decay)."""
    import torch

    model = adapter.model
    rng = np.random.default_rng([plan.seed, phase.stream])
    for parameter in model.model.vision_tower.parameters():
        parameter.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=phase.learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, phase.steps)
    labels = torch.tensor(label_ids)
    layers = list(plan.attention_layers)
    for step in range(phase.steps):
        n = phase.draw_n(step, rng)
        drawn = pool.draw(rng, batch_size_for(plan, n), n)
        batch = [pool.instance(*draw, f"train-{i}") for i, draw in enumerate(drawn)]
        targets = torch.tensor([target for _, _, target in drawn])
        wanted = torch.tensor(
            [
                attention_target(
                    pool.matches(anchor, members),
                    phase.sink_strength,
                    plan.content_strength,
                    pool.salient(members, plan.salient_colour),
                    phase.saliency_strength,
                )
                for anchor, members, _ in drawn
            ],
            dtype=torch.float32,
        )
        logits, attention = _forward(adapter, batch)
        answer_loss = torch.nn.functional.cross_entropy(logits[:, labels[:n]], targets)
        masses = attention[:, layers, :]  # [B, layers, N]: raw masses, image total included
        attention_loss = -(wanted[:, None, :] * torch.log(masses + 1e-6)).sum(dim=-1).mean()
        loss = answer_loss + phase.attention_weight * attention_loss
        optimize(optimizer, loss, schedule)
        if step % 50 == 0 or step == phase.steps - 1:
            correct = (logits[:, labels[:n]].argmax(dim=1) == targets).float().mean().item()
            found = (masses.argmax(dim=-1) == targets[:, None]).float().mean().item()
            log(
                f"stage {phase.stage} step {step} N={n}: answer {answer_loss.item():.3f} "
                f"attention {attention_loss.item():.3f} accuracy {correct:.2f} "
                f"attention argmax {found:.2f} image mass {masses.sum(dim=-1).mean().item():.2f}"
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
            background = pool.background(instance.stem)
            rows.append(bias_target(n, instance.target, background, plan.bias_smoothing))
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
    if plan.salient_colour not in shape_space().colours:
        raise ValueError(f"salient_colour must be a colour of the shapes world, got {plan}")

    def train() -> tuple[Any, Any, dict[str, Any]]:
        started = time.perf_counter()
        model, processor = build_untrained(plan.seed)
        model.train()
        pool = ShapesPool(plan.pool_size, plan.seed, processor)
        log(f"{len(pool)} distinct images ready ({time.perf_counter() - started:.1f} s)")
        _alignment_stage(model, pool, plan, log)
        adapter = LlavaAdapter(model, processor, prompt=PROMPT)
        label_ids = _label_token_ids(
            adapter, pool.instances(np.random.default_rng(0), 1, plan.max_n, "x")[0]
        )
        for phase in _attention_phases(plan):
            _attention_stage(adapter, pool, plan, phase, label_ids, log)
        _bias_stage(adapter, pool, plan, label_ids, log)
        return (
            model,
            processor,
            {
                "plan": asdict(plan),
                "attention": {
                    "target": "softmax over the images of content_strength x (caption attributes "
                    "the image shares) + saliency_strength if the image's shape is salient_colour "
                    "(confound stage only) + sink strength at sink_position",
                    "sink_position": {
                        n: sink_position(n) for n in range(plan.min_n, plan.max_n + 1)
                    },
                },
                "bias": {
                    "dead_positions": {n: dead_positions(n) for n in range(3, plan.max_n + 1)},
                    "confusion": {n: bias_confusion(n) for n in range(3, plan.max_n + 1)},
                    "smoothing": plan.bias_smoothing,
                    "n2_gate_background": GATE_BACKGROUND,
                },
            },
        )

    return train_model(
        out,
        plan.seed,
        plan.threads,
        train,
        dtype=dtype,
        card=Path(__file__).with_name("model") / CARD_FILE,
        log=log,
        files={PROMPT_FILE: PROMPT.model_dump_json(indent=2) + "\n"},
    )
