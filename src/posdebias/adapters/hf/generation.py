"""Free generation for the generated baselines: batched, left padded, greedy or sampled, seeded.

The paper's vanilla, instruction, chain-of-thought and self-consistency rows generate text and
parse the index from it (posdebias.core.answers). :meth:`HFAdapter.generate_many` runs this
module's loop instead of ``model.generate`` for two reasons:

* several samples of one prompt share ONE prefill: the prompt runs once per instance and the
  samples decode together over ONE copy of its keys and values (shared_prefix.py; each sample
  keeps only its own new tokens), so 10 self-consistency chains cost about one
  chain-of-thought generation, not ten (``model.generate(num_return_sequences=10)`` prefills
  ten copies, and repeating the cache makes every step read ten copies of the prompt);
* positions are explicit (the adapter's ``prompt_position_ids`` / ``decode_position_ids``, also
  multimodal RoPE), so a padded row sees what it would see alone, and every sample draws from
  its own generator seeded by (instance seed, sample index): the texts do not depend on the
  batch size or on which other instances share the batch.

A row stops at an end-of-sequence token (the model's eos ids and the adapter's end token),
at a stop string (the text is cut before it), or after ``max_new_tokens``. With the adapter
option ``logits_processors: generation_config`` (the reference protocol) every step's logits pass
through the checkpoint's generation-config logits processors first (e.g. a repetition penalty),
as ``generate`` would apply them. Sampling uses the settings' temperature and top-k; with
``sampling_config: generation_config`` (the reference protocol's self-consistency) also every
other sampling warper of the checkpoint's generation config (top_p, min_p, typical_p, ...), as
``generate(do_sample=True, temperature=..., top_k=...)`` inherits them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from posdebias.adapters.attention.shared_prefix import decoding_over, share_prefix
from posdebias.adapters.base import Generation, GenerationSettings, sample_seed
from posdebias.adapters.hf.model import ModelAdapter, batch_groups, kv_cache
from posdebias.core.instance import Instance
from posdebias.errors import InputError


def generate_many(
    adapter: ModelAdapter,
    instances: Sequence[Instance],
    settings: GenerationSettings,
    *,
    batch_size: int = 1,
    seeds: Sequence[int] | None = None,
) -> list[Generation]:
    """One :class:`Generation` per instance, in order (batches group instances of one N)."""
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    seeds = list(range(len(instances))) if seeds is None else list(seeds)
    if len(seeds) != len(instances):
        raise InputError(f"{len(seeds)} seeds for {len(instances)} instances")
    results: dict[int, Generation] = {}
    for chunk in batch_groups(instances, batch_size, adapter.label_set):
        generated = _generate_batch(
            adapter, [instances[i] for i in chunk], settings, [seeds[i] for i in chunk]
        )
        results.update(zip(chunk, generated, strict=True))
    return [results[index] for index in range(len(instances))]


#: the generation config's logits processors and sampling warpers, as an error of the model's
#: own code names them
PROCESSORS_CALL = "generation-config logits processors"


def generation_config_processors(model: Any, prompt_ids: Any, mask: Any) -> Any:
    """The checkpoint's generation-config logits processors for these prompts, as greedy
    ``generate`` builds them (no sampling warpers); called as ``processors(ids, logits)``
    with the prompt ids plus the tokens chosen so far."""
    base = model.generation_config
    config = base.__class__.from_dict({**base.to_dict(), "do_sample": False})
    return model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=prompt_ids.shape[1],
        encoder_input_ids=prompt_ids,
        device=prompt_ids.device,
        model_kwargs={"attention_mask": mask},
    )


def generation_config_warpers(model: Any, settings: GenerationSettings) -> Any:
    """The sampling warpers ``generate(do_sample=True, temperature=T, top_k=K)`` builds from
    the checkpoint's generation config: temperature and top-k from ``settings``, every other
    sampling setting (top_p, min_p, typical_p, ...) the checkpoint's; penalties left out (the
    adapter option ``logits_processors`` decides those). Called as ``warpers(ids, logits)``."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import LogitsProcessorList

    base = getattr(model, "generation_config", None) or GenerationConfig()
    config = base.__class__.from_dict(
        {
            **base.to_dict(),
            "do_sample": True,
            "num_beams": 1,
            "temperature": settings.temperature,
            "top_k": settings.top_k if settings.top_k is not None else 0,
        }
    )
    processors = model._get_logits_processor(generation_config=config, device="cpu")
    return LogitsProcessorList(
        [proc for proc in processors if type(proc).__name__.endswith("LogitsWarper")]
    )


def _stop_ids(adapter: ModelAdapter) -> set[int]:
    ids: set[int] = set()
    generation = getattr(adapter.model, "generation_config", None)
    for candidate in (
        getattr(generation, "eos_token_id", None),
        adapter.tokenizer.eos_token_id,
        adapter.end_token_id,
    ):
        if isinstance(candidate, (list, tuple)):
            ids.update(int(c) for c in candidate)
        elif candidate is not None:
            ids.add(int(candidate))
    return ids


def _cut(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _generate_batch(
    adapter: ModelAdapter,
    instances: list[Instance],
    settings: GenerationSettings,
    seeds: list[int],
) -> list[Generation]:
    import torch

    started = time.perf_counter()
    batch = adapter.prepare_batch(instances, variant=settings.prompt_variant)
    samples = settings.num_samples
    rows = len(instances) * samples
    stop_ids = _stop_ids(adapter) if settings.stop_at_eos else set()
    generators = [
        torch.Generator().manual_seed(sample_seed(seed, s))
        for seed in seeds
        for s in range(samples)
    ]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    texts = [""] * rows
    finished = [False] * rows
    passes = [1] * len(instances)
    prompt_tokens = batch.inputs["attention_mask"].sum(dim=1).tolist()
    with torch.inference_mode():
        output, _ = adapter.prompt_forward(batch, attention=False, sofa=settings.sofa)
        cache = kv_cache(output)
        logits = output.logits[:, -1, :]
        mask = batch.inputs["attention_mask"]
        positions = batch.position_ids
        extra = adapter.decode_inputs(batch.inputs, 1)  # the same for every step
        shared = False
        if samples > 1:
            # a cross-attention layer's cache holds the encoder's keys, not the prompt's:
            # only a self-attention model decodes over one shared copy of its prompt
            shared = (
                settings.share_prefix
                and not adapter.cross_attention_layers
                and share_prefix(cache, samples)
            )
            if not shared:
                cache.batch_repeat_interleave(samples)
            logits = logits.repeat_interleave(samples, dim=0)
            mask = mask.repeat_interleave(samples, dim=0)
            positions = positions.repeat_interleave(samples, dim=positions.ndim - 2)
            extra = {name: value.repeat_interleave(samples, dim=0) for name, value in extra.items()}
        warpers, processors = None, None
        with adapter.model_code(PROCESSORS_CALL):  # the checkpoint's generation config's
            if settings.do_sample and settings.sampling_config == "generation_config":
                warpers = generation_config_warpers(adapter.model, settings)
            if adapter.options.logits_processors != "none":
                prompt_ids = batch.inputs["input_ids"].repeat_interleave(samples, dim=0)
                processors = generation_config_processors(adapter.model, prompt_ids, mask)
                history = prompt_ids
        for step in range(1, settings.max_new_tokens + 1):
            with adapter.model_code(PROCESSORS_CALL):
                if processors is not None:
                    logits = processors(history, logits.float())
                chosen = _choose(logits, settings, generators, warpers)
            for row, token in enumerate(chosen):
                if finished[row]:
                    continue
                if token in stop_ids:
                    finished[row] = True
                    continue
                tokens[row].append(token)
                if settings.stop:
                    text = adapter.tokenizer.decode(tokens[row], skip_special_tokens=True)
                    texts[row], finished[row] = _cut(text, settings.stop)
            if all(finished) or step == settings.max_new_tokens:
                break
            for index in range(len(instances)):
                if not all(finished[index * samples : (index + 1) * samples]):
                    passes[index] += 1
            ids = torch.tensor(chosen, dtype=torch.long, device=mask.device)[:, None]
            mask = torch.cat([mask, torch.ones_like(ids, dtype=mask.dtype)], dim=1)
            if processors is not None:
                history = torch.cat([history, ids.to(history.dtype)], dim=1)
            with decoding_over(cache) if shared else contextlib.nullcontext():
                output = adapter.model_forward(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=adapter.decode_position_ids(positions, step)[..., -1:],
                    use_cache=True,
                    **adapter.last_logits_only,
                    **extra,
                    **{adapter.cache_argument: cache},
                )
            logits = output.logits[:, -1, :]
    if not settings.stop:
        texts = [adapter.tokenizer.decode(row, skip_special_tokens=True) for row in tokens]
    share = (time.perf_counter() - started) / len(instances)
    results = []
    for index in range(len(instances)):
        own = range(index * samples, (index + 1) * samples)
        counts = [len(tokens[row]) for row in own]
        results.append(
            Generation(
                texts=[texts[row] for row in own],
                generated_tokens=sum(counts),
                forward_passes=passes[index],
                prompt_tokens=int(prompt_tokens[index]),
                seconds=share,
                token_counts=counts,
                tokens=[list(tokens[row]) for row in own],
            )
        )
    return results


def _choose(
    logits: Any, settings: GenerationSettings, generators: list[Any], warpers: Any = None
) -> list[int]:
    """Greedy argmax, or one draw per row from softmax(logits / T) over the top-k tokens (or
    from softmax of the ``warpers``' output: the generation config's sampling settings)."""
    import torch

    logits = logits.to(torch.float32)
    if not settings.do_sample:
        return logits.argmax(dim=-1).tolist()
    if warpers is not None:
        ids = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)
        warped = torch.softmax(warpers(ids, logits), dim=-1).cpu()
        return [
            int(torch.multinomial(warped[row], 1, generator=generator).item())
            for row, generator in enumerate(generators)
        ]
    logits = logits / settings.temperature
    if settings.top_k is not None and settings.top_k < logits.shape[-1]:
        values, indices = torch.topk(logits, settings.top_k, dim=-1)
    else:
        values = logits
        indices = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
    probabilities = torch.softmax(values, dim=-1).cpu()
    indices = indices.cpu()
    return [
        int(indices[row, torch.multinomial(probabilities[row], 1, generator=generator)].item())
        for row, generator in enumerate(generators)
    ]
