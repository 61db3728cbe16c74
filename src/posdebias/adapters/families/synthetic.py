"""A simulated model: observations from a documented generative model, no neural network.

It lets the calibrators, the runner and the CLI run in milliseconds and reproduces the paper's
qualitative claim: label scores carry a CONDITIONAL position bias, attention still finds the
truth. For truth at position t of an instance shown in a given order (docs/synthetic.md):

    content_k  ~ N(0, content_noise^2)           per (query, image): hard distractors
    s_j  = log_softmax_j( C[t, j] + logit_evidence * [j == t] + content_j + noise * e_j )
    z^(l)_k = sink^(l)_k + w_l * (attention_evidence * [k == t] + content_k) + noise * e'_lk
    a^(l)_k = m_l * softmax_k(z^(l))             m_l = mass of layer l on the images

C is the conditional bias matrix (default: a primacy pull plus a neighbour confusion of every
odd position with the previous one), sink^(l) a static per-layer positional artefact, w_l the
informativeness of layer l (1 in the informative layers, 0 elsewhere) and m_l the image mass,
larger in the informative layers. Like a real model it sees only what is shown: the matching
image is the one whose id the query names (``synthetic_instances`` builds such pairs; otherwise
the instance's target), and all randomness is keyed by seed, query and image ids.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator

import posdebias.defaults as defaults
from posdebias._markers import register_hook
from posdebias.adapters.base import Adapter, AdapterOptions, Generation, LabelSetName, sample_seed
from posdebias.core.instance import Instance, candidate_noun
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.observation import Observation, log_softmax, softmax
from posdebias.errors import InputError


def default_bias_matrix(n: int, primacy: float = 1.5, confusion: float = 2.5) -> np.ndarray:
    """C[i, j]: answer the first position more often; with the truth at an odd (0-based)
    position, answer the position before it. Conditional: no static prior can undo it."""
    bias = np.zeros((n, n))
    bias[:, 0] += primacy
    for i in range(1, n, 2):
        bias[i, i - 1] += confusion
    return bias


#: A size of the simulated model's scores and attention (log-probability units): at 100 every
#: score is already decided by it alone.
Scale = Annotated[float, Field(ge=-100, le=100)]


class SyntheticOptions(AdapterOptions):
    num_layers: int = Field(default=8, ge=1, le=defaults.MAX_LAYERS, description="simulated layers")
    informative_layers: list[Annotated[int, Field(ge=0, le=defaults.MAX_LAYERS)]] | None = Field(
        default=None, description="layers whose attention carries evidence (default: top half)"
    )
    bias: list[list[Scale]] | None = Field(default=None, description="C [N, N] (default above)")
    bias_scale: Scale = Field(default=1.0, ge=0, description="multiplies C; 0 = bias-free model")
    logit_evidence: Scale = Field(
        default=2.0, ge=0, description="how much the label scores favour the truth"
    )
    attention_evidence: Scale = Field(
        default=1.5, ge=0, description="how much informative layers' attention favours the truth"
    )
    attention_shift: int = Field(
        default=0,
        ge=-defaults.MAX_CANDIDATES,
        le=defaults.MAX_CANDIDATES,
        description="informative attention favours the image this many positions after the "
        "truth (cyclically; 0 = the truth): attention that is consistently wrong",
    )
    content_noise: Scale = Field(
        default=0.3, ge=0, description="std of per (query, image) similarity: hard distractors"
    )
    noise: Scale = Field(default=0.5, ge=0, description="std of per-view noise on every score")
    sink_strength: Scale = Field(
        default=1.0, ge=0, description="scale of each layer's static positional attention sink"
    )
    label_set: LabelSetName = Field(
        default=None, description="labels the simulated model answers (default: the task's own)"
    )
    seed: int = Field(default=0, ge=0, le=defaults.MAX_SEED, description="seed of every draw")
    latency: float = Field(default=0.0, ge=0, le=60, description="seconds slept per forward pass")

    @model_validator(mode="after")
    def _check(self) -> SyntheticOptions:
        for layer in self.informative_layers or []:
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"informative layer {layer} outside 0..{self.num_layers - 1}")
        return self


def _rng(*keys: Any) -> np.random.Generator:
    digest = hashlib.sha256("\x1f".join(map(str, keys)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


@functools.lru_cache(maxsize=1 << 16)
def _content(seed: int, stem: str, candidate: str) -> float:
    """A candidate's content score for a stem: the same in every order it is shown in, so it is
    drawn once (a generator per draw was a third of a simulated forward's time)."""
    return float(_rng("content", seed, stem, candidate).normal())


@functools.lru_cache(maxsize=256)
def _layer_profile(
    seed: int, n: int, sink_strength: float, informative: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Every layer's sinks [L, N] and mass [L]: the same for every view of a run, so drawn once
    (read-only: shared by every observation)."""
    num_layers = len(informative)
    rng = _rng("layers", seed, n, num_layers)
    sinks = sink_strength * rng.normal(size=(num_layers, n))
    sinks[:, 0] += sink_strength  # a first-image sink in every layer
    mass = 0.05 + 0.1 * rng.random(num_layers) + 0.3 * np.array(informative)
    sinks.flags.writeable = mass.flags.writeable = False
    return sinks, mass


class SyntheticAdapter(Adapter):
    """The simulated model (see the module docstring for its equations)."""

    name = "synthetic"
    Options = SyntheticOptions
    summary = "simulated position-biased model with informative attention (no network)"

    def __init__(self, **options: Any) -> None:
        self.options: SyntheticOptions = self.parse_options(options)  # type: ignore[assignment]
        self.label_set = self.options.label_set

    @classmethod
    def create(cls, **options: Any) -> SyntheticAdapter:
        return cls(**options)

    @property
    def num_layers(self) -> int:
        return self.options.num_layers

    def _informative(self) -> np.ndarray:
        layers = self.options.informative_layers
        if layers is None:
            layers = list(range(self.options.num_layers // 2, self.options.num_layers))
        weight = np.zeros(self.options.num_layers)
        weight[layers] = 1.0
        return weight

    def bias_matrix(self, n: int) -> np.ndarray:
        if self.options.bias is None:
            bias = default_bias_matrix(n)
        else:
            bias = np.asarray(self.options.bias, dtype=float)
            if bias.shape != (n, n):
                raise InputError(f"synthetic bias matrix is {bias.shape}, instances have N={n}")
        return self.options.bias_scale * bias

    def _static_layer_profile(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        opts = self.options
        return _layer_profile(opts.seed, n, opts.sink_strength, tuple(self._informative()))

    @staticmethod
    def matching_position(instance: Instance) -> int | None:
        """Where the image the query describes sits (``synthetic_instances`` queries end with
        the matching image's id); the instance's target for other instances."""
        named = instance.stem.rsplit(" ", 1)[-1]
        for position, image_id in enumerate(instance.candidate_ids):
            if image_id == named:
                return position
        return instance.target

    def observe_one(self, instance: Instance) -> Observation:
        n = instance.n
        check_candidate_count(n, get_label_set(self.label_set_for(instance.task)))
        opts = self.options
        target = self.matching_position(instance)
        truth = np.zeros(n)
        if target is not None:
            truth[target] = 1.0
        content = np.array(
            [_content(opts.seed, instance.stem, image) for image in instance.candidate_ids]
        )
        content *= opts.content_noise
        noise_rng = _rng("order", opts.seed, instance.stem, *instance.candidate_ids)
        row = self.bias_matrix(n)[target] if target is not None else np.zeros(n)
        logits = row + opts.logit_evidence * truth + content + opts.noise * noise_rng.normal(size=n)
        sinks, mass = self._static_layer_profile(n)
        weight = self._informative()[:, None]
        evidence = opts.attention_evidence * np.roll(truth, opts.attention_shift) + content
        z = sinks + weight * evidence + opts.noise * noise_rng.normal(size=(opts.num_layers, n))
        layer_mass = mass * np.exp(0.1 * noise_rng.normal(size=opts.num_layers))
        attention = layer_mass[:, None] * softmax(z)
        return Observation(
            label_logprobs=log_softmax(logits), attention=attention, target=instance.target
        )

    def observe_many(
        self, instances: Sequence[Instance], *, batch_size: int = 1
    ) -> list[Observation]:
        if self.options.latency:
            time.sleep(self.options.latency * len(instances))
        return [self.observe_one(instance) for instance in instances]

    def generate_many(
        self,
        instances: Sequence[Instance],
        settings: Any,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Any]:
        """Simulated generation: the answer is the label drawn from the observation's label
        distribution (argmax when greedy; softmax(s / T) over the top-k when sampling), written
        as ``"{label}"``, or under the ``cot`` variant as a short reasoning that names the two
        most likely candidates (in the task's noun) and ends with ``The answer is {label}``.
        Words count as tokens; text past ``max_new_tokens`` words is cut (a cut reasoning may
        lose its answer). The prompt
        wording has no other effect on the simulated model, and SoFA is not simulated."""

        if settings.sofa is not None:
            raise InputError("the simulated model has no attention mask: SoFA needs a real model")
        seeds = list(range(len(instances))) if seeds is None else list(seeds)
        results = []
        for instance, seed in zip(instances, seeds, strict=True):
            started = time.perf_counter()
            scores = self.observe_one(instance).label_logprobs
            labels = self.labels_for(instance.n, instance.task)
            ranked = np.argsort(-scores, kind="stable")
            texts, counts = [], []
            for sample in range(settings.num_samples):
                if settings.do_sample:
                    keep = ranked[: settings.top_k or len(ranked)]
                    weights = softmax(scores[keep] / settings.temperature)
                    rng = np.random.default_rng(sample_seed(seed, sample))
                    choice = int(keep[rng.choice(len(keep), p=weights)])
                else:
                    choice = int(ranked[0])
                words = [labels[choice]]
                variant = settings.prompt_variant or "plain"
                if variant in ("cot", "posdebias_cot", "self_consistency"):
                    noun = candidate_noun(instance.task, plural=False)
                    stem = "caption" if instance.task == "retrieval" else "question"
                    words = (
                        f"{noun.capitalize()} {labels[ranked[0]]} and {noun} "
                        f"{labels[ranked[1]]} are the closest to the {stem}. The answer is "
                        f"{labels[choice]}"
                    ).split()
                words = words[: settings.max_new_tokens]
                texts.append(" ".join(words))
                counts.append(len(words))
            passes = max(counts)  # the prefill gives the first token
            if self.options.latency:
                time.sleep(self.options.latency * passes)
            results.append(
                Generation(
                    texts=texts,
                    generated_tokens=sum(counts),
                    forward_passes=passes,
                    prompt_tokens=0,
                    token_counts=counts,
                    seconds=time.perf_counter() - started,
                )
            )
        return results

    def describe(self, n: int | None = None) -> dict[str, Any]:
        return {
            "adapter": self.name,
            "model_id": "synthetic",
            "prompt_hash": None,
            "options": self.options.model_dump(mode="json"),
        }


def synthetic_instances(count: int, n: int, seed: int = 0, prefix: str = "syn") -> list[Instance]:
    """``count`` instances of N abstract images for the simulated model; the truth position
    is uniform, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    instances = []
    for index in range(count):
        ident = f"{prefix}-{seed}-{index:05d}"
        images = tuple(f"synthetic://{ident}/{k}" for k in range(n))
        target = int(rng.integers(n))
        instances.append(
            Instance(stem=f"the image {images[target]}", images=images, target=target, id=ident)
        )
    return instances


posdebias_register_adapters = register_hook(SyntheticAdapter)
