"""Shared Hugging Face machinery: prompt rendering, batching, one probed forward, label scoring.

A family adapter subclasses :class:`HFAdapter` and says only what differs: which tokens make an
image span (:meth:`HFAdapter.span_tokens`), whether consecutive images' token runs touch
(``split_by_processor_counts``), how the processor wants the images, and the position ids
(:meth:`HFAdapter.prompt_position_ids`). Everything else is here, once:

1. each instance becomes chat messages (:class:`PromptTemplate`) rendered with the processor's
   chat template and generation prompt; the batch is tokenised with LEFT padding, so the last
   position of every row is its last prompt token;
2. ONE forward pass of the prompt runs with the attention probe recording (probe.py) and the KV
   cache kept; position ids are explicit so a padded row sees exactly the positions it would see
   alone (results do not depend on the batch size);
3. the labels are scored with the restricted softmax (scoring.py): the prompt's last logits plus
   one cached decoding step per distinct multi-token prefix.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field, field_validator

from posdebias.adapters.base import Adapter, AdapterOptions
from posdebias.adapters.generation import generate_many
from posdebias.adapters.probe import install_probe, recording
from posdebias.adapters.prompt import PROMPT_VARIANTS, PromptTemplate, coerce_prompt
from posdebias.adapters.scoring import plan_labels, score_labels
from posdebias.adapters.sofa import sofa_scope
from posdebias.adapters.spans import SpanTokens, find_image_spans, span_matrix
from posdebias.core.instance import RetrievalInstance
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.observation import Observation
from posdebias.errors import AdapterError, InputError

if TYPE_CHECKING:
    from posdebias.adapters.generation import Generation, GenerationSettings
    from posdebias.adapters.scoring import LabelPlan, Prefix


class HFAdapterOptions(AdapterOptions):
    """Options of every Hugging Face adapter (``adapter.options`` in a config file).

    ``model`` and the loading options are used by :func:`posdebias.load_adapter`; the others
    also apply to :func:`posdebias.get_adapter` on an already loaded model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, description="model id or local path")
    label_set: str = Field(default="digits", description="digits, upper, lower, roman, words")
    prompt: PromptTemplate | None = Field(
        default=None, description="prompt template fields, or a JSON file (default: METHOD.md)"
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
    dtype: str = Field(default="auto", description="auto, float32, bfloat16 or float16")
    device: str | None = Field(default=None, description="cpu, cuda, cuda:1 (default: best)")
    device_map: str | dict[str, Any] | None = Field(default=None, description="accelerate map")
    trust_remote_code: bool = False
    revision: str | None = None

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


def load_image(reference: Any, instance_id: str) -> Any:
    """An RGB PIL image from a path or a PIL image; clear errors for missing or bad files."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(reference, Image.Image):
        return reference.convert("RGB")
    if not isinstance(reference, (str, Path)):
        raise InputError(
            f"instance {instance_id!r}: image {reference!r} is neither a path nor a PIL image"
        )
    text = str(reference)
    if "://" in text:
        raise InputError(
            f"instance {instance_id!r}: image {text!r} is not a file; a real model needs image "
            "files (build a benchmark, or pass paths / PIL images)"
        )
    path = Path(text)
    if not path.is_file():
        raise InputError(f"instance {instance_id!r}: image file {path} does not exist")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(
            f"instance {instance_id!r}: image file {path} cannot be read as an image ({exc})"
        ) from None


@dataclass
class PreparedBatch:
    """Model inputs of one batch (left padded) with what the probe and the scorer need.

    Attributes:
        inputs: the processor's tensors on the model's device.
        position_ids: explicit prompt positions (padding-independent).
        spans: per row, the [start, end) token range of each image.
        plan: the label token trie for this N.
    """

    inputs: Any
    position_ids: Any
    spans: list[list[tuple[int, int]]]
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
                f"the processor of {self.model_id} rejected the prompt and its images: {exc}. "
                "The chat template must render one image placeholder per image item"
            ) from exc

    def prompt_position_ids(self, inputs: Any) -> Any:
        """Position ids of the padded prompt: each row counts from 0 at its first real token."""
        mask = inputs["attention_mask"]
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 0)

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
        return int(self._text_config.num_hidden_layers)

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
        images = [[load_image(im, inst.id) for im in inst.images] for inst in instances]
        _, plan = self.plan_for(n, texts[0])
        inputs = self.processor_inputs(texts, images)
        offsets = inputs.pop("text_replacement_offsets", None)
        spans = [
            find_image_spans(
                inputs["input_ids"][row],
                self.tokens,
                n,
                tokens_per_image=self._tokens_per_image(offsets, row),
            )
            for row in range(len(instances))
        ]
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
                output = self.model(
                    **batch.inputs,
                    position_ids=batch.position_ids,
                    use_cache=True,
                    **self._last_logits_only,
                )
            masses = recorder.attention(self.num_layers) if recorder is not None else None
            cache = getattr(output, "cache", None) or output.past_key_values
            mask = batch.inputs["attention_mask"]

            def decode(prefix: Prefix) -> Any:
                return self._decode_step(prefix, mask, batch.position_ids, cache, length)

            scores = score_labels(batch.plan, output.logits[:, -1, :], decode)
        return scores, masses

    def _observe_batch(self, instances: list[RetrievalInstance]) -> list[Observation]:
        scores, attention = self.run_batch(self.prepare_batch(instances))
        self._last_n = instances[0].n
        scores_np = scores.double().cpu().numpy()
        attention_np = attention.double().numpy()
        return [
            Observation(
                label_logprobs=scores_np[row],
                attention=attention_np[row],
                target=instance.target,
            )
            for row, instance in enumerate(instances)
        ]

    def generate_many(
        self,
        instances: Sequence[RetrievalInstance],
        settings: GenerationSettings,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:

        return generate_many(self, instances, settings, batch_size=batch_size, seeds=seeds)

    def _tokens_per_image(self, offsets: Any, row: int) -> list[int] | None:
        if not self.split_by_processor_counts:
            return None
        if offsets is None:
            raise AdapterError(
                f"{type(self.processor).__name__} returns no text replacement offsets; cannot "
                "split touching image-token runs per image"
            )
        return [
            entry["replacement"].count(self.image_token)
            for entry in offsets[row]
            if entry.get("type") == "image"
        ]

    def _decode_step(
        self, prefix: Prefix, prompt_mask: Any, positions: Any, cache: Any, length: int
    ) -> Any:
        """One cached decoding step: logits after ``prefix`` on top of the prompt's KV cache."""
        import torch

        batch = prompt_mask.shape[0]
        k = len(prefix)
        ids = torch.tensor([list(prefix)] * batch, dtype=torch.long, device=prompt_mask.device)
        mask = torch.cat([prompt_mask, torch.ones_like(ids, dtype=prompt_mask.dtype)], dim=1)
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=self.decode_position_ids(positions, k),
            use_cache=True,
            **self._last_logits_only,
            **{self._cache_argument: cache},
        )
        cache.crop(-k)  # rewind to the prompt for the next prefix
        if cache.get_seq_length() != length:
            raise AdapterError("the KV cache could not be rewound to the prompt")
        return output.logits[:, -1, :]

    def describe(self) -> dict[str, Any]:
        import transformers

        return {
            "adapter": self.name,
            "model_id": self.model_id,
            "revision": getattr(self.model.config, "_commit_hash", None),
            "model_type": getattr(self.model.config, "model_type", None),
            "dtype": str(getattr(self.model, "dtype", "")).replace("torch.", ""),
            "device": str(self.device),
            "num_layers": self.num_layers,
            "label_set": self.label_set,
            "labels": self.labels,
            "prompt_hash": self.prompt.digest(),
            "prompt": self.prompt.model_dump(mode="json"),
            "end_token": None
            if self.end_token_id is None
            else self.tokenizer.convert_ids_to_tokens(self.end_token_id),
            "answer_prefix": self.answer_prefix,
            "prompt_variant": self.prompt_variant,
            "transformers": transformers.__version__,
        }
