"""Shared Hugging Face machinery: prompt rendering, batching, one probed forward, label scoring.

A family adapter subclasses :class:`HFAdapter` and says only what differs: which tokens make an
image span (:meth:`HFAdapter.span_tokens`, or every token of each image given directly by
:meth:`HFAdapter.image_spans`), whether consecutive images' token runs touch
(``split_by_processor_counts``), how the processor wants the images, and the position ids
(:meth:`HFAdapter.prompt_position_ids`). Everything else is here, once:

1. each instance becomes chat messages (:class:`PromptTemplate`) rendered with the processor's
   chat template and generation prompt; the batch is tokenised with LEFT padding, so the last
   position of every row is its last prompt token;
2. ONE forward pass of the prompt runs with the attention probe recording (probe.py) and the KV
   cache kept; position ids are explicit so a padded row sees exactly the positions it would see
   alone (results do not depend on the batch size);
3. the labels are scored with the restricted softmax (scoring.py): the prompt's last logits plus
   one cached decoding step per distinct multi-token prefix;
4. the first batch an adapter observes with a model is verified against the model's own forward
   (verify.py): a family whose positions the adapter does not reproduce stops with an error
   instead of giving wrong scores.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from posdebias._images import min_image_side, open_image
from posdebias._inputs import excerpt
from posdebias.adapters.attention import install_probe, recording
from posdebias.adapters.attention.sofa import sofa_scope
from posdebias.adapters.base import Adapter, AdapterOptions
from posdebias.adapters.hf.cache import PromptCache
from posdebias.adapters.hf.generation import generate_many
from posdebias.adapters.hf.layers import attention_layers
from posdebias.adapters.hf.prompt import PROMPT_VARIANTS, PromptTemplate, coerce_prompt
from posdebias.adapters.hf.scoring import plan_labels, score_labels
from posdebias.adapters.hf.spans import (
    ImageSpan,
    SpanTokens,
    as_span,
    check_spans,
    find_image_spans,
    span_matrix,
)
from posdebias.adapters.hf.verify import refuse_unsupported, verify_first_batch, verify_instance
from posdebias.core.instance import RetrievalInstance
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.layers import LayerSet
from posdebias.core.observation import Observation
from posdebias.errors import AdapterError, InputError

if TYPE_CHECKING:
    from posdebias.adapters.base import Generation, GenerationSettings
    from posdebias.adapters.hf.scoring import LabelPlan, Prefix


class HFAdapterOptions(AdapterOptions):
    """Options of every Hugging Face adapter (``adapter.options`` in a config file).

    ``model`` and the loading options are used by :func:`posdebias.load_adapter`; the others
    also apply to :func:`posdebias.get_adapter` on an already loaded model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, description="model id or local path")
    label_set: str = Field(default="digits", description="digits, upper, lower, roman, words")
    prompt: PromptTemplate | None = Field(
        default=None,
        description="prompt template fields, or a JSON file (default: the method's prompt)",
    )
    prompt_variant: str = Field(
        default="plain",
        description="plain, instruction or cot (the method page of the documentation)",
    )
    end_token: str | None = Field(
        default=None, description="end-of-answer token (default: the model's first eos token)"
    )
    answer_prefix: str = Field(
        default="", description="text before the label in the answer, e.g. ' ' for LLaVA-1.5"
    )
    image_size: int | None = Field(
        default=None, ge=1, description="resize every image to this square (bicubic) first"
    )
    logits_processors: Literal["none", "generation_config"] = Field(
        default="none",
        description="score labels on raw logits, or after the checkpoint's generation-config "
        "logits processors (greedy decoding; e.g. a repetition penalty)",
    )
    dtype: str = Field(default="auto", description="auto, float32, bfloat16 or float16")
    device: str | None = Field(default=None, description="cpu, cuda, cuda:1 (default: best)")
    device_map: str | dict[str, Any] | None = Field(default=None, description="accelerate map")
    trust_remote_code: bool = Field(
        default=False, description="run the checkpoint's own Python code (only if you trust it)"
    )
    revision: str | None = Field(default=None, description="hub branch, tag or commit")

    @field_validator("label_set")
    @classmethod
    def _known_label_set(cls, value: str) -> str:
        get_label_set(value)
        return value

    @field_validator("prompt_variant")
    @classmethod
    def _known_variant(cls, value: str) -> str:
        if value not in PROMPT_VARIANTS:
            raise ValueError(f"unknown prompt variant {value!r}; choose one of {PROMPT_VARIANTS}")
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _coerce_prompt(cls, value: Any) -> Any:
        return coerce_prompt(value)


LOADING_OPTIONS = ("model", "dtype", "device", "device_map", "trust_remote_code", "revision")


def load_image(reference: Any, instance_id: str, min_side: int | None = None) -> Any:
    """An RGB PIL image from a path or a PIL image; clear errors for missing or bad files.

    Files open through :func:`posdebias._images.open_image` (raster formats only, a pixel cap,
    shrunk early to no less than ``min_side`` on the short side).
    """
    from PIL import Image

    if isinstance(reference, Image.Image):
        return reference.convert("RGB")
    if not isinstance(reference, (str, Path)):
        raise InputError(
            f"instance {excerpt(instance_id)}: image {excerpt(reference)} is neither a path "
            "nor a PIL image"
        )
    text = str(reference)
    if "://" in text:
        raise InputError(
            f"instance {excerpt(instance_id)}: image {excerpt(text)} is not a file; a real model "
            "needs image files (build a benchmark, or pass paths / PIL images)"
        )
    return open_image(text, what=f"instance {excerpt(instance_id)}: image", min_side=min_side)


@dataclass
class PreparedBatch:
    """Model inputs of one batch (left padded) with what the probe and the scorer need.

    Attributes:
        inputs: the processor's tensors on the model's device.
        position_ids: explicit prompt positions (padding-independent).
        spans: per row, every token of each image (:class:`ImageSpan`), in prompt order.
        plan: the label token trie for this N.
    """

    inputs: Any
    position_ids: Any
    spans: list[list[ImageSpan]]
    plan: LabelPlan


class HFAdapter(Adapter):
    """Base of the Hugging Face adapters (see the module docstring for the flow)."""

    name: ClassVar[str] = "hf"
    Options = HFAdapterOptions
    text_config_key: ClassVar[str] = "text_config"
    split_by_processor_counts: ClassVar[bool] = False

    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        model_id: str | None = None,
        label_set: str = "digits",
        prompt: PromptTemplate | dict | str | Path | None = None,
        end_token: str | None = None,
        answer_prefix: str = "",
        image_size: int | None = None,
        logits_processors: str = "none",
        prompt_variant: str = "plain",
    ) -> None:

        self.model = model
        self.processor = processor
        tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None:
            raise AdapterError(f"{type(processor).__name__} has no tokenizer")
        self.tokenizer: Any = tokenizer
        if not getattr(processor, "chat_template", None):
            raise AdapterError(
                f"the processor of {model_id or type(model).__name__} has no chat template; "
                "posdebias renders prompts with it (set processor.chat_template)"
            )
        self.label_set = get_label_set(label_set).name
        self.base_prompt = coerce_prompt(prompt) or PromptTemplate()
        self.prompt_variant = prompt_variant
        self.prompt = self.base_prompt.variant(prompt_variant)
        self.answer_prefix = answer_prefix
        self.image_size = image_size
        self.logits_processors = logits_processors
        self.model_id = model_id or getattr(model.config, "name_or_path", None) or None
        self.image_token = self._image_token()
        self.tokens = self.span_tokens()
        self.end_token_id = self._end_token_id(end_token)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # needed for batches only
        install_probe(model, self.text_config_key)
        self._text_config = getattr(model.config, self.text_config_key)
        self._plans: dict[int, tuple[list[str], LabelPlan]] = {}
        self._last_n: int | None = None
        forward = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward else "past_key_values"
        # Only the last position's logits are needed; older forwards lack the argument.
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}

    # -- construction --------------------------------------------------------------------------

    # -- family hooks --------------------------------------------------------------------------

    def _image_token(self) -> str:
        token = getattr(self.processor, "image_token", None)
        if not isinstance(token, str) or not token:
            raise AdapterError(
                f"{type(self.processor).__name__} declares no image token; posdebias needs one "
                "to find each image's tokens (write an adapter plugin: see the Adapters docs page)"
            )
        return token

    def span_tokens(self) -> SpanTokens:
        """The image token (and start / end markers) of this family."""
        image_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        if image_id is None or image_id == self.tokenizer.unk_token_id:
            raise AdapterError(f"image token {self.image_token!r} is not in the vocabulary")
        return SpanTokens(image=image_id)

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """Every token of each image in one prompt row, one :class:`ImageSpan` per image.

        The probe's span matrix and the image masses use exactly these tokens. The default is
        one run of image tokens per image (split by the processor's per-image counts when
        ``split_by_processor_counts``) widened by the start / end markers of
        :meth:`span_tokens`. Override it for other layouts (tiles, row markers, break tokens):
        return spans whose runs hold all tokens of image k; they are validated by
        :func:`posdebias.adapters.hf.spans.check_spans`.

        Args:
            input_ids: the row's token ids (left padding included; pad ids are no image's).
            num_images: N.
            replacements: the text the processor substituted for each image placeholder, in
                prompt order (``None`` when the processor does not report it).
        """
        counts = None
        if self.split_by_processor_counts:
            if replacements is None:
                raise AdapterError(
                    f"{type(self.processor).__name__} returns no text replacement offsets; "
                    "cannot split touching image-token runs per image"
                )
            counts = [replacement.count(self.image_token) for replacement in replacements]
        return find_image_spans(input_ids, self.tokens, num_images, tokens_per_image=counts)

    def image_token_ids(self) -> set[int]:
        """Tokens that only ever belong to an image: every one must lie in some span."""
        tokens = self.tokens
        return {t for t in (tokens.image, tokens.start, tokens.end) if t is not None}

    def position_problem(self) -> str | None:
        """Why this adapter cannot reproduce the model's positions, or None (it can)."""
        return None

    def processor_inputs(self, texts: list[str], images: list[list[Any]]) -> Any:
        """Tokenise the rendered prompts and preprocess the images (one list per prompt)."""
        try:
            return self.processor(
                text=texts,
                images=images,
                padding=True,
                padding_side="left",
                return_tensors="pt",
                return_text_replacement_offsets=True,
            )
        except ValueError as exc:
            raise AdapterError(
                f"the processor of {self.model_id} rejected the prompt and its images: {exc}"
            ) from exc

    def prompt_position_ids(self, inputs: Any) -> Any:
        """Position ids of the padded prompt: each row counts from 0 at its first real token."""
        mask = inputs["attention_mask"]
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 0)

    def model_forward(self, **inputs: Any) -> Any:
        """One forward of the model (prompt or decoding step); an output with ``logits`` and the
        cache. A family whose own forward cannot run as is overrides this (Llama 4)."""
        return self.model(**inputs)

    def decode_position_ids(self, prompt_positions: Any, length: int) -> Any:
        """Positions of ``length`` tokens appended after the prompt."""
        import torch

        step = torch.arange(1, length + 1, device=prompt_positions.device)
        return prompt_positions[..., -1:] + step

    # -- helpers -------------------------------------------------------------------------------

    def _end_token_id(self, end_token: str | None) -> int | None:
        if end_token is not None:
            token_id = self.tokenizer.convert_tokens_to_ids(end_token)
            if token_id is None or token_id == self.tokenizer.unk_token_id:
                raise InputError(f"end_token {end_token!r} is not a token of this tokenizer")
            return int(token_id)
        generation = getattr(self.model, "generation_config", None)
        candidate = getattr(generation, "eos_token_id", None) if generation else None
        if candidate is None:
            candidate = self.tokenizer.eos_token_id
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        return None if candidate is None else int(candidate)

    @property
    def num_layers(self) -> int:
        """Layers of the language model (all kinds; see :attr:`attention_layers` for the rows)."""
        return int(self._text_config.num_hidden_layers)

    @property
    def attention_layers(self) -> LayerSet:
        """The softmax-attention layers the probe reads (adapters/layers.py)."""
        return attention_layers(self._text_config)

    @property
    def labels(self) -> list[str] | None:
        return None if self._last_n is None else self.labels_for(self._last_n)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def render(self, instance: RetrievalInstance, prompt: PromptTemplate | None = None) -> str:
        """The prompt text of one instance (chat template + generation prompt)."""
        messages = (prompt or self.prompt).messages(
            instance.query, instance.n, get_label_set(self.label_set)
        )
        try:
            return self.processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja errors come in many types
            raise AdapterError(
                f"the chat template of {self.model_id} cannot render the prompt: {exc}"
            ) from exc

    def plan_for(self, n: int, rendered: str) -> tuple[list[str], LabelPlan]:
        """Label strings and their token trie for N candidates (cached per N)."""

        if n not in self._plans:
            labels = self.labels_for(n)
            tokens = [self.label_tokens(rendered, label) for label in labels]
            self._plans[n] = (labels, plan_labels(tokens, self.end_token_id, labels))
        return self._plans[n]

    def label_tokens(self, rendered: str, label: str) -> list[int]:
        """The tokens the model emits for ``label`` right after the generation prompt.

        Tokenised in context (prompt + answer minus prompt), so merges across the boundary are
        those the model saw in training; falls back to the label alone if the prompt's tokens
        change when the answer is appended.
        """
        answer = self.answer_prefix + label
        base = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        full = self.tokenizer(rendered + answer, add_special_tokens=False)["input_ids"]
        if len(full) > len(base) and full[: len(base)] == base:
            return list(full[len(base) :])
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])

    # -- observation ---------------------------------------------------------------------------

    def observe_many(
        self, instances: Sequence[RetrievalInstance], *, batch_size: int = 1
    ) -> list[Observation]:
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        results: list[Observation | None] = [None] * len(instances)
        by_n: dict[int, list[int]] = {}
        for index, instance in enumerate(instances):
            by_n.setdefault(instance.n, []).append(index)
        for n in sorted(by_n):
            check_candidate_count(n, get_label_set(self.label_set))
            indices = by_n[n]
            for start in range(0, len(indices), batch_size):
                chunk = indices[start : start + batch_size]
                observed = self._observe_batch([instances[i] for i in chunk])
                for index, observation in zip(chunk, observed, strict=True):
                    results[index] = observation
        return results  # type: ignore[return-value]

    def prepare_batch(
        self, instances: Sequence[RetrievalInstance], prompt: PromptTemplate | None = None
    ) -> PreparedBatch:
        """Render, tokenise (left padding) and locate the image spans of instances with one N
        (``prompt``: another template than the adapter's, e.g. a prompt variant)."""
        n = instances[0].n
        if any(instance.n != n for instance in instances):
            raise InputError("a batch must hold instances with the same number of images")
        texts = [self.render(instance, prompt) for instance in instances]
        side = min_image_side(self.processor)
        images = [[self._load_image(im, inst.id, side) for im in inst.images] for inst in instances]
        _, plan = self.plan_for(n, texts[0])
        inputs = self.processor_inputs(texts, images)
        offsets = inputs.pop("text_replacement_offsets", None)
        spans = []
        covered = self.image_token_ids()
        for row in range(len(instances)):
            ids = inputs["input_ids"][row].tolist()
            row_spans = [as_span(s) for s in self.image_spans(ids, n, _replacements(offsets, row))]
            check_spans(row_spans, ids, covered, n)
            spans.append(row_spans)
        positions = self.prompt_position_ids(inputs)
        inputs = inputs.to(self.device)
        model_dtype = getattr(self.model, "dtype", None)
        if model_dtype is not None and "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(model_dtype)
        return PreparedBatch(
            inputs=inputs, position_ids=positions.to(self.device), spans=spans, plan=plan
        )

    def run_batch(self, batch: PreparedBatch, *, attention: bool = True) -> tuple[Any, Any]:
        """One probed prompt forward + label scoring: ([B, N] scores, [B, L, N] attention).

        ``attention=False`` runs plain SDPA and returns ``None`` for the attention, the cost of
        a method that reads the label scores only (benchmarks/end_to_end.py compares the two).
        """

        import torch

        length = batch.inputs["input_ids"].shape[1]
        with torch.inference_mode():
            probe = (
                recording(span_matrix(batch.spans, length))
                if attention
                else contextlib.nullcontext()
            )
            with probe as recorder, sofa_scope(batch.spans, length):
                output = self.model_forward(
                    **batch.inputs,
                    position_ids=batch.position_ids,
                    use_cache=True,
                    **self._last_logits_only,
                )
            masses = recorder.attention(self.attention_layers) if recorder is not None else None
            cache = PromptCache(getattr(output, "cache", None) or output.past_key_values, length)
            mask = batch.inputs["attention_mask"]

            processed = self._label_logits_processor(batch.inputs["input_ids"], mask)

            def decode(prefix: Prefix) -> Any:
                logits = self._decode_step(prefix, mask, batch.position_ids, cache, length)
                return processed(prefix, logits)

            scores = score_labels(batch.plan, processed((), output.logits[:, -1, :]), decode)
        return scores, masses

    def verify(self, instance: RetrievalInstance) -> None:
        """Stop with :class:`AdapterError` unless this adapter's label scores of ``instance``
        equal the model's own forward (verify.py; cached per model, so the first observed
        batch then needs no extra work)."""
        verify_instance(self, instance)

    def _observe_batch(self, instances: list[RetrievalInstance]) -> list[Observation]:
        refuse_unsupported(self)
        batch = self.prepare_batch(instances)
        scores, attention = self.run_batch(batch)
        verify_first_batch(self, instances, batch, scores)  # once per model and adapter class
        self._last_n = instances[0].n
        scores_np = scores.double().cpu().numpy()
        attention_np = attention.double().numpy()
        layers = self.attention_layers
        return [
            Observation(
                label_logprobs=scores_np[row],
                attention=attention_np[row],
                target=instance.target,
                layers=layers,
            )
            for row, instance in enumerate(instances)
        ]

    def _load_image(self, reference: Any, instance_id: str, min_side: int | None = None) -> Any:
        image = load_image(reference, instance_id, min_side)
        if self.image_size is None:
            return image
        from PIL import Image

        return image.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)

    def _label_logits_processor(self, prompt_ids: Any, mask: Any) -> Any:
        """``(prefix, logits) -> logits`` for label scoring: raw, or after the checkpoint's
        generation-config logits processors as greedy ``generate`` applies them (they see the
        prompt ids plus ``prefix``; left padding is ignored through the attention mask)."""
        if self.logits_processors == "none":
            return lambda prefix, logits: logits
        import torch

        base = self.model.generation_config
        config = base.__class__.from_dict({**base.to_dict(), "do_sample": False})
        processors = self.model._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=prompt_ids.shape[1],
            encoder_input_ids=prompt_ids,
            device=prompt_ids.device,
            model_kwargs={"attention_mask": mask},
        )

        def apply(prefix: Prefix, logits: Any) -> Any:
            extra = torch.tensor([list(prefix)] * prompt_ids.shape[0], dtype=prompt_ids.dtype)
            ids = torch.cat([prompt_ids, extra.to(prompt_ids.device)], dim=1)
            return processors(ids, logits.float())

        return apply

    def generate_many(
        self,
        instances: Sequence[RetrievalInstance],
        settings: GenerationSettings,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:

        return generate_many(self, instances, settings, batch_size=batch_size, seeds=seeds)

    def _decode_step(
        self, prefix: Prefix, prompt_mask: Any, positions: Any, cache: PromptCache, length: int
    ) -> Any:
        """One cached decoding step: logits after ``prefix`` on top of the prompt's KV cache."""
        import torch

        batch = prompt_mask.shape[0]
        k = len(prefix)
        ids = torch.tensor([list(prefix)] * batch, dtype=torch.long, device=prompt_mask.device)
        mask = torch.cat([prompt_mask, torch.ones_like(ids, dtype=prompt_mask.dtype)], dim=1)
        output = self.model_forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=self.decode_position_ids(positions, k),
            use_cache=True,
            **self._last_logits_only,
            **{self._cache_argument: cache.cache},
        )
        cache.rewind(k)  # back to the prompt for the next prefix (adapters/cache.py)
        return output.logits[:, -1, :]

    def describe(self, n: int | None = None) -> dict[str, Any]:
        import transformers

        return {
            "adapter": self.name,
            "model_id": self.model_id,
            "revision": getattr(self.model.config, "_commit_hash", None),
            "model_type": getattr(self.model.config, "model_type", None),
            "dtype": str(getattr(self.model, "dtype", "")).replace("torch.", ""),
            "device": str(self.device),
            "num_layers": self.num_layers,
            **self.attention_layers.to_dict(),
            "label_set": self.label_set,
            "labels": None if n is None else self.labels_for(n),
            "prompt_hash": self.prompt.digest(),
            "image_size": self.image_size,
            "logits_processors": self.logits_processors,
            "prompt": self.prompt.model_dump(mode="json"),
            "end_token": None
            if self.end_token_id is None
            else self.tokenizer.convert_ids_to_tokens(self.end_token_id),
            "answer_prefix": self.answer_prefix,
            "prompt_variant": self.prompt_variant,
            "transformers": transformers.__version__,
        }


def _replacements(offsets: Any, row: int) -> list[str] | None:
    """The processor's replacement text of each image placeholder of one row, or None."""
    if offsets is None:
        return None
    return [entry["replacement"] for entry in offsets[row] if entry.get("type") == "image"]
