"""Shared Hugging Face machinery: prompt rendering, batching, one probed forward, label scoring.

A family adapter subclasses :class:`HFAdapter` and says only what differs: which tokens make an
image span (:meth:`HFAdapter.span_tokens`, or every token of each image given directly by
:meth:`HFAdapter.image_spans`), whether consecutive images' token runs touch
(``split_by_processor_counts``), how the processor wants the images, and the position ids
(:meth:`HFAdapter.prompt_position_ids`). Everything else is here, once:

1. each instance becomes chat messages (its task's :class:`TaskTemplate`) rendered with the
   processor's chat template and generation prompt; the batch is tokenised with LEFT padding,
   so the last position of every row is its last prompt token;
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
import hashlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from posdebias._images import min_image_side, open_image
from posdebias._inputs import excerpt, file_identity
from posdebias.adapters.attention import install_probe, recording
from posdebias.adapters.attention.sofa import sofa_attention, sofa_scope
from posdebias.adapters.base import Adapter, AdapterOptions, SofaSettings, split_tie
from posdebias.adapters.hf import generation
from posdebias.adapters.hf.cache import PromptCache
from posdebias.adapters.hf.generation import PROCESSORS_CALL, generation_config_processors
from posdebias.adapters.hf.layers import attention_layers
from posdebias.adapters.hf.model import LogitsProcessor, PreparedBatch, batch_groups, kv_cache
from posdebias.adapters.hf.options import IMAGE_OPTIONS, LOADING_OPTIONS, HFAdapterOptions
from posdebias.adapters.hf.prompt import (
    check_answer_joins,
    check_instance_prompts,
    check_template_control_tokens,
    control_tokens,
    neutral_instance,
    neutral_prompts,
    posed_messages,
    refuse_joined_control_tokens,
    resolve_chat_template,
    template_fields,
)
from posdebias.adapters.hf.scoring import plan_labels, score_labels
from posdebias.adapters.hf.spans import (
    ImageSpan,
    SpanTokens,
    as_span,
    candidate_spans,
    check_candidate_spans,
    check_spans,
    expand_replacements,
    find_image_spans,
    find_marked_spans,
    span_matrix,
    tokens_in_range,
)
from posdebias.adapters.hf.verify import refuse_unsupported, verify_first_batch, verify_instance
from posdebias.core.instance import Instance
from posdebias.core.layers import LayerSet
from posdebias.core.observation import Observation
from posdebias.core.tasks import (
    TEXT_TASKS,
    candidate_char_spans,
    check_sentinel_free,
    scored_labels,
    text_only_messages,
)
from posdebias.errors import (
    AdapterError,
    Advice,
    ConfigError,
    InputError,
    ModelCodeError,
    PosdebiasError,
)

if TYPE_CHECKING:
    from posdebias.adapters.attention import CrossAttentionSpans
    from posdebias.adapters.hf.scoring import LabelPlan, Prefix


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


#: Decoded images an adapter keeps (the most recently used; more than the 26 candidates an
#: instance may have): a run shows each instance's images once per order and rotation in a row,
#: and decoding them again took 13% of an N = 12 run.
DECODED_IMAGES = 32

#: the processor call as an error of the model's own code names it
PROCESSOR_CALL = "processor (the prompt's tokens and images)"


class BatchingUnsafe(AdapterError):
    """Raised by :meth:`HFAdapter.run_batch` when a padded batch would give other numbers than
    its rows alone (e.g. Llama 4's NoPE temperature counting the padding). The adapter's own
    ``observe_many`` then runs the rows one at a time; ``posdebias check`` does the same and
    says so."""


class HFAdapter(Adapter):
    """Base of the Hugging Face adapters (see the module docstring for the flow)."""

    name: ClassVar[str] = "hf"
    Options = HFAdapterOptions
    #: Where the language model's config is (``None``: the model's own config, a text model).
    text_config_key: ClassVar[str | None] = "text_config"
    split_by_processor_counts: ClassVar[bool] = False
    #: The model config's attribute naming the token that carries the image features, for a
    #: family whose processor's ``image_token`` is only a placeholder; None: it is that token.
    image_token_key: ClassVar[str | None] = None
    #: For a family whose image is everything from its start marker to its end marker
    #: (:meth:`span_tokens`; tiles, tile labels, a global view): that layout, named in errors.
    marked_layout: ClassVar[str | None] = None
    #: A text-only language model: its processor is its tokenizer, its prompts hold no image.
    text_only: ClassVar[bool] = False
    image_options: ClassVar[tuple[str, ...]] = IMAGE_OPTIONS
    #: Whether the prompt is tokenised with the tokenizer's special tokens (a BOS), as the
    #: processor does; text models take them from the chat template instead.
    prompt_special_tokens: ClassVar[bool] = True
    #: The family's own prompt format, for checkpoints whose processor has no chat template
    #: (PaliGemma); a processor's own chat template always wins, and without either the
    #: tokenizer's is used.
    default_chat_template: ClassVar[str | None] = None
    #: Whether the checkpoints load as a causal LM (``AutoModelForCausalLM``: the text models,
    #: and Phi-4-multimodal, whose embedding layer reads the images) instead of an
    #: image-text-to-text model.
    loads_as_causal_lm: ClassVar[bool] = False

    @classmethod
    def option_names(cls) -> list[str]:
        """A text-only model takes neither the image options nor retrieval's prompt (it would
        not use them: they are refused, and its errors do not offer them)."""
        names = super().option_names()
        unused = (*cls.image_options, "prompt") if cls.text_only else ()
        return [name for name in names if name not in unused]

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> AdapterOptions:
        """A text-only model refuses the options it would not use, before reading them (a
        prompt file it would never pose is not opened)."""
        if cls.text_only:
            unused = [n for n in (*cls.image_options, "prompt") if options.get(n) is not None]
            if unused:
                raise ConfigError(
                    f"adapter {cls.name!r} reads a text-only model, which shows no image and "
                    f"poses no retrieval prompt: leave out the option(s) {', '.join(unused)} (a "
                    "text task's prompt is the option task_prompt)"
                )
        return super().parse_options(options)

    def __init__(
        self, model: Any, processor: Any, *, model_id: str | None = None, **options: Any
    ) -> None:
        """``options``: the adapter's options, checked by its options model (:attr:`Options`,
        :class:`HFAdapterOptions`: an unknown or malformed option is refused); those that load
        a model (``model``, ``dtype``, ``device``, ...) belong to :func:`posdebias.load_adapter`
        and are refused here."""
        loading = sorted(set(options) & set(LOADING_OPTIONS))
        if loading:
            raise InputError(
                f"get_adapter wraps a loaded model; options {loading} only apply to load_adapter"
            )
        opts = self.parse_options(options)
        assert isinstance(opts, HFAdapterOptions)  # every HF adapter's Options derive from it
        self.model = model
        self.processor = processor
        tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None and self.text_only:
            tokenizer = processor  # a text model's processor is its tokenizer
        if tokenizer is None:
            given = type(processor).__name__
            if hasattr(processor, "convert_tokens_to_ids"):  # a tokenizer, not a processor
                raise AdapterError(
                    f"adapter {self.name!r} is for vision-language models, which come with a "
                    f"processor; a tokenizer ({given}) was given, as for a text-only model: "
                    "leave the adapter to posdebias (it is chosen by the model's config) or name "
                    "a text family (`posdebias plugins` lists them)"
                )
            raise AdapterError(
                f"adapter {self.name!r} needs the model's processor (or, for a text-only model, "
                f"its tokenizer); {given} has no tokenizer"
            )
        self.tokenizer: Any = tokenizer
        # the processor's chat template, else the family's own format (PaliGemma), else the
        # tokenizer's (a processor saved without one, as Phi-4-multimodal's)
        if opts.chat_template is not None:
            self.chat_template_override: str | None = resolve_chat_template(
                opts.chat_template, tokenizer
            )
        else:
            self.chat_template_override = (
                None
                if getattr(processor, "chat_template", None)
                else self.default_chat_template or getattr(tokenizer, "chat_template", None)
            )
        if not getattr(processor, "chat_template", None) and not self.chat_template_override:
            advice = Advice(
                "give it with the adapter option chat_template (a template, a file holding one, "
                "or 'raw' for the prompt's text as it is)",
                "give it with --chat-template FILE or TEXT (adapter option chat_template), or "
                "--chat-template raw for the prompt's text as it is",
                'give it with "chat_template" in the adapter_options file of the model arguments '
                '(a template, a file holding one, or "raw" for the prompt\'s text as it is)',
            )
            raise AdapterError(
                f"{model_id or type(model).__name__} has no chat template (a base model?); "
                f"posdebias renders prompts with one: {advice.library}",
                advice=advice,
            )
        #: the options as parsed: one home for what they say (the label set and the variant are
        #: also the adapter contract's attributes)
        self.options = opts
        self.label_set = opts.label_set
        self.prompt_variant = opts.prompt_variant
        self.model_id = model_id or getattr(model.config, "name_or_path", None) or None
        #: every task's template as configured, and under the adapter's prompt variant
        self.base_task_templates, self.task_templates = opts.templates()
        # a text model has no image token: an id no token has keeps the types simple
        self.image_token = "" if self.text_only else self._image_token()
        self.tokens = SpanTokens(image=-1) if self.text_only else self.span_tokens()
        self.end_token_id = self._end_token_id(opts.end_token)
        #: the special tokens no question, caption, option or template may hold
        self.control_tokens = control_tokens(self.tokenizer, processor)
        check_template_control_tokens(
            self.base_task_templates,
            self.control_tokens,
            self.model_id or self.name,
            [("answer_prefix", self.options.answer_prefix)],
            self.label_set,
        )
        if self.control_tokens is not None:
            prompts: list[tuple[str, str, list[str]]] = []
            # the retrieval prompt poses images: only a model that reads them poses it
            for task in TEXT_TASKS if self.text_only else self.task_templates:
                # no prompt renders (no chat template): that error comes where it is used
                with contextlib.suppress(InputError, AdapterError):
                    prompts += neutral_prompts(
                        [task],
                        lambda neutral: self.chat_text(self.messages_for(neutral)),
                        self.labels_for,
                    )
            check_answer_joins(
                prompts, self.options.answer_prefix, self.control_tokens, self.model_id or self.name
            )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # needed for batches only
        #: where this model's language model config is (``text_config_key`` as the family says,
        #: or as :meth:`language_config_key` finds it on the model)
        self.language_key = self.language_config_key(model)
        install_probe(model, self.language_key)
        key = self.language_key
        self._text_config = model.config if key is None else getattr(model.config, key)
        self._plans: dict[tuple[int, str], tuple[list[str], LabelPlan]] = {}
        self._decoded: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._decoded_lock = threading.Lock()  # a server may observe from several threads
        self._check_tie_label()
        forward = inspect.signature(model.forward).parameters
        self.cache_argument = "cache" if "cache" in forward else "past_key_values"
        # Only the last position's logits are needed; older forwards lack the argument.
        self.last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        #: whether the prompt forward is handed an empty cache (a model that makes none itself)
        self._gives_cache = False

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def language_config_key(cls, model: Any) -> str | None:
        """Where ``model``'s language model config is: the family's ``text_config_key``."""
        return cls.text_config_key

    @classmethod
    def prepare_loaded(cls, model: Any, folder: Path) -> Any:
        """The model to wrap, after :func:`posdebias.load_adapter` loaded ``model`` from the
        checkpoint ``folder`` (the directory, or the cached snapshot of a hub id) and before it
        is moved to its device: ``model`` itself by default (Phi-4-multimodal merges its vision
        LoRA)."""
        return model

    # -- family hooks --------------------------------------------------------------------------

    def _image_token(self) -> str:
        if self.image_token_key is not None:
            token_id = int(getattr(self.model.config, self.image_token_key))
            return str(self.tokenizer.convert_ids_to_tokens(token_id))
        token = getattr(self.processor, "image_token", None)
        if not isinstance(token, str) or not token:
            raise AdapterError(
                f"{type(self.processor).__name__} declares no image token; posdebias needs one "
                "to find each image's tokens (write an adapter plugin: see the Adapters docs page)"
            )
        return token

    def span_tokens(self) -> SpanTokens:
        """The image token (and start / end markers) of this family."""
        return SpanTokens(image=self.vocabulary_id(self.image_token, "image token"))

    def vocabulary_id(self, token: str, what: str = "marker") -> int:
        """The id of one of the family's tokens; :class:`AdapterError` when the vocabulary
        lacks it (a tokenizer of another family)."""
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise AdapterError(f"{what} {token!r} is not in the vocabulary")
        return int(token_id)

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """Every token of each image in one prompt row, one :class:`ImageSpan` per image.

        The probe's span matrix and the image masses use exactly these tokens. The default is
        one run of image tokens per image (split by the processor's per-image counts when
        ``split_by_processor_counts``) widened by the start / end markers of
        :meth:`span_tokens`; with ``marked_layout``, all from one marker to the other. Override
        it for other layouts (row markers, break tokens): return spans whose runs hold all
        tokens of image k; they are validated by :func:`posdebias.adapters.hf.spans.check_spans`.

        Args:
            input_ids: the row's token ids (left padding included; pad ids are no image's).
            num_images: N.
            replacements: the text the processor substituted for each image placeholder, in
                prompt order (``None`` when the processor does not report it).
        """
        if self.text_only:
            raise AdapterError(f"{self.name} is a text-only adapter; its prompts hold no image")
        if self.marked_layout is not None:
            start, end = self.tokens.start, self.tokens.end
            if start is None or end is None:
                raise AdapterError(f"{self.name}'s span tokens name no image start / end markers")
            return find_marked_spans(input_ids, start, end, num_images, self.marked_layout)
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
        if self.text_only:
            return set()
        return {t for t in (tokens.image, tokens.start, tokens.end) if t is not None}

    def support_problem(self) -> str | None:
        """Why this adapter cannot read this model right, found BEFORE any forward pass, or
        None. Runs (and whoever runs ``posdebias check``) stop with it at once; the default is
        :meth:`position_problem`. The first-batch verification stays the safety net for what
        cannot be seen from the config and the processor."""
        return self.position_problem()

    def task_problem(self, task: str) -> str | None:
        """Why this adapter cannot pose instances of ``task`` (a task kind), or None; checked
        before any forward by ``posdebias check`` and for every batch."""
        return None

    def position_problem(self) -> str | None:
        """Why this adapter cannot reproduce the model's positions, or None (it can)."""
        return None

    def processor_inputs(self, texts: list[str], images: list[list[Any]]) -> Any:
        """Tokenise the rendered prompts and preprocess the images (one list per prompt).

        A batch without any image (a text-only question on a vision-language model) passes no
        images at all: image processors fail on empty lists. Batches never mix prompts with
        and without images (:func:`batch_groups`)."""
        limit = self.tile_limit(len(images[0]) if images else 0)
        tiles = {} if limit is None else {"max_patches": limit}
        # the processor's own code failing otherwise (KeyError: 'rows', ...) is the model's
        with self.model_code(PROCESSOR_CALL):
            try:
                return self.processor(
                    text=texts,
                    images=images if any(images) else None,
                    padding=True,
                    padding_side="left",
                    return_tensors="pt",
                    return_text_replacement_offsets=True,
                    **tiles,
                )
            except ValueError as exc:  # a prompt or images it refuses: the input's problem
                raise AdapterError(
                    f"the processor of {self.model_id} rejected the prompt and its images: {exc}"
                ) from exc

    @contextlib.contextmanager
    def model_code(self, call: str) -> Iterator[None]:
        """Run the model's own ``call`` (its processor, its forward, its position ids): an
        exception of the model's code leaves as :meth:`model_code_error` words it."""
        try:
            yield
        except Exception as exc:
            error = self.model_code_error(call, exc)
            if error is exc:
                raise
            raise error from exc

    def model_code_error(self, call: str, exc: BaseException) -> BaseException:
        """``exc`` raised inside the model's own ``call`` (its processor, its forward) as a
        :class:`ModelCodeError` naming the family, the call, the error and what to try; our
        own errors, and exceptions raised in posdebias's code (the attention probe, a hook),
        are returned as they are: those are ours to report."""
        if isinstance(exc, (PosdebiasError, MemoryError)) or _raised_in_posdebias(exc, type(self)):
            return exc
        if type(exc).__name__ == "OutOfMemoryError":  # torch's: not the model's fault
            return exc
        import transformers

        return ModelCodeError(
            f"the model's {call} raised {type(exc).__name__}: {str(exc)[:300]} "
            f"(model {self.model_id}, family {self.name}, transformers {transformers.__version__})"
            ". This is the model's own code, not posdebias: check that the model's processor and "
            "config files match this transformers version (try the version its model card "
            "names), or report it to the model's authors; --debug shows where it was raised"
        )

    def tile_limit(self, n: int) -> int | None:
        """The ``max_patches`` passed to the processor for prompts with n images: None when
        the option is unset or the image processor does not tile (no ``crop_to_patches``);
        ``reference`` is 28 // n, at least 1 (the authors' InternVL setting)."""
        image_processor = getattr(self.processor, "image_processor", None)
        if self.options.max_patches is None or not hasattr(image_processor, "crop_to_patches"):
            return None
        if self.options.max_patches == "reference":
            return max(1, 28 // max(n, 1))
        return int(self.options.max_patches)

    def prompt_position_ids(self, inputs: Any) -> Any:
        """Position ids of the padded prompt: each row counts from 0 at its first real token."""
        mask = inputs["attention_mask"]
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 0)

    def model_forward(self, **inputs: Any) -> Any:
        """One forward of the model (prompt or decoding step); an output with ``logits`` and the
        cache. An exception of the model's own code is reported as the model's
        (:meth:`model_code_error`), whatever :meth:`own_forward` a family runs."""
        with self.model_code("forward"):
            return self.own_forward(**inputs)

    def own_forward(self, **inputs: Any) -> Any:
        """The model's forward itself: a family whose forward cannot run as is, or must be
        checked first, overrides this (Llama 4, Phi-4-multimodal)."""
        return self.model(**inputs)

    def extended_inputs(self, inputs: dict[str, Any], extra: Any) -> dict[str, Any]:
        """The model inputs of one unpadded prompt with the tokens ``extra`` ([1, k]) appended,
        as the model's own generation feeds them: attention mask 1, every other per-token input
        (token types) that of a text token, 0, and a cross-attention mask row that of the last
        prompt token. The reference forward of verify.py; a family whose generated tokens have
        other token types overrides it (PaliGemma)."""
        import torch

        length = inputs["input_ids"].shape[1]
        full = dict(inputs)
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and tuple(value.shape) == (1, length):
                fill = torch.ones_like if name == "attention_mask" else torch.zeros_like
                full[name] = torch.cat([value, fill(extra, dtype=value.dtype)], dim=1)
            elif name == "cross_attention_mask":  # Mllama: [1, T, images, tiles]
                # a new token sees the images the last prompt token sees (generate's rule)
                rows = value[:, -1:].expand(-1, extra.shape[1], *value.shape[2:])
                full[name] = torch.cat([value, rows], dim=1)
        full["input_ids"] = torch.cat([inputs["input_ids"], extra.to(inputs["input_ids"])], dim=1)
        return full

    @property
    def cross_attention_layers(self) -> tuple[int, ...]:
        """Layers whose keys are not the prompt but a vision encoder's tokens (Mllama); the
        other families read their images in the prompt and have none."""
        return ()

    def cross_attention_spans(self, batch: PreparedBatch) -> CrossAttentionSpans | None:
        """Which keys of the cross-attention layers belong to each image, per row (None: the
        model has no cross-attention layers). With them the probe reads those layers only."""
        return None

    def decode_inputs(self, prompt_inputs: Any, steps: int) -> dict[str, Any]:
        """What a decoding step of ``steps`` new tokens after the prompt needs besides the ids,
        the mask, the positions and the cache (Mllama: the cross-attention mask rows of the new
        tokens); the default is nothing."""
        return {}

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
        defaults = getattr(self.model, "generation_config", None)
        candidate = getattr(defaults, "eos_token_id", None) if defaults else None
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
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def check_instances(self, instances: Sequence[Instance]) -> None:
        templates = [text for _, text in template_fields(self.task_templates)]
        for instance in instances:
            if instance.has_texts:
                check_sentinel_free(instance)  # the spans of its texts are placed with them
            check_instance_prompts(
                self, instance, self.model_id or self.name, self.render, template_texts=templates
            )

    def messages_for(
        self,
        instance: Instance,
        *,
        sentinels: bool = False,
        variant: str | None = None,
    ) -> list[dict]:
        """The chat messages of ``instance``: its task's template under the adapter's prompt
        variant, or under ``variant`` (a generated baseline's, e.g. ``cot``) instead
        (``sentinels``: see :meth:`posdebias.core.tasks.TaskTemplate.messages`)."""
        model = self.model_id or self.name
        messages = posed_messages(self, instance, model, variant=variant, sentinels=sentinels)
        return text_only_messages(messages) if self.text_only else messages

    def chat_text(self, messages: list[dict]) -> str:
        """The prompt text of ``messages``: the chat template (the override when given) with its
        generation prompt; one place, so label prompts and reply prompts agree."""
        override = self.chat_template_override
        template = {} if override is None else {"chat_template": override}
        try:
            return self.processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **template
            )
        except Exception as exc:  # jinja errors come in many types
            raise AdapterError(
                f"the chat template of {self.model_id} cannot render the prompt: {exc}"
            ) from exc

    def render(
        self,
        instance: Instance,
        *,
        variant: str | None = None,
    ) -> str:
        """The prompt text of one instance (chat template + generation prompt; ``variant``:
        see :meth:`messages_for`), refused if the data complete one of the
        model's special tokens where fields meet (:func:`refuse_joined_control_tokens`)."""
        text = self.chat_text(self.messages_for(instance, variant=variant))
        if self.control_tokens is not None:
            neutral = neutral_instance(instance)
            refuse_joined_control_tokens(
                f"instance {excerpt(instance.id)}",
                text,
                self.chat_text(self.messages_for(neutral, variant=variant)),
                self.control_tokens,
                self.model_id or self.name,
            )
        return text

    def render_with_spans(
        self,
        instance: Instance,
        *,
        variant: str | None = None,
    ) -> tuple[str, list[tuple[int, int] | None]]:
        """The prompt text and, per candidate, the characters ``[start, end)`` of its text in
        it (None for a candidate without text): the prompt is rendered once with a sentinel in
        place of each text, so the text's position is known exactly, and once as is; the two
        must agree (a chat template that rewrites message content is refused)."""
        text = self.render(instance, variant=variant)
        if not instance.has_texts:
            return text, [None] * instance.n
        marked = self.chat_text(self.messages_for(instance, sentinels=True, variant=variant))
        try:
            rebuilt, spans = candidate_char_spans(marked, list(instance.texts))
        except ConfigError as exc:
            raise AdapterError(f"{self.model_id}: {exc}") from None
        if rebuilt != text:
            raise AdapterError(
                f"the chat template of {self.model_id} changes the candidates' text as it "
                "renders it; posdebias cannot place the text spans"
            )
        return text, spans

    def plan_for(
        self, n: int, rendered: str, task: str | None = None
    ) -> tuple[list[str], LabelPlan]:
        """Label strings and their token trie for N candidates of ``task`` (cached per N and
        label set); a judge's tie label (``task_prompt.tie_label``) is the trie's last path,
        after the N answers' labels (:func:`posdebias.core.tasks.scored_labels`)."""

        key = (n, self.label_set_for(task) + ("+tie" if task == "pairwise_judge" else ""))
        if key not in self._plans:
            labels = self.labels_for(n, task)
            scored = scored_labels(task, self.task_templates.get(task or ""), labels)
            tokens = [self.label_tokens(rendered, label) for label in scored]
            if len(scored) > n and len(tokens[n]) != 1:
                raise ConfigError(_two_token_tie(scored[n], tokens[n], self.model_id))
            self._plans[key] = (labels, plan_labels(tokens, self.end_token_id, scored))
        return self._plans[key]

    def _check_tie_label(self) -> None:
        """Refuse a judge's tie label before any run: one an answer also uses, or one the
        tokenizer does not write as ONE token (its probability is then read at one step, as
        a letter's; ConfigError, exit 2)."""
        template = self.task_templates["pairwise_judge"]
        scored = scored_labels("pairwise_judge", template, self.labels_for(2, "pairwise_judge"))
        if len(scored) > 2:
            tokens = self.tokenizer(
                self.options.answer_prefix + scored[2], add_special_tokens=False
            )
            if len(tokens["input_ids"]) != 1:
                raise ConfigError(_two_token_tie(scored[2], tokens["input_ids"], self.model_id))

    def label_tokens(self, rendered: str, label: str) -> list[int]:
        """The tokens the model emits for ``label`` right after the generation prompt.

        Tokenised in context (prompt + answer minus prompt), so merges across the boundary are
        those the model saw in training; falls back to the label alone if the prompt's tokens
        change when the answer is appended.
        """
        answer = self.options.answer_prefix + label
        base = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        full = self.tokenizer(rendered + answer, add_special_tokens=False)["input_ids"]
        if len(full) > len(base) and full[: len(base)] == base:
            return list(full[len(base) :])
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])

    # -- observation ---------------------------------------------------------------------------

    def observe_many(
        self, instances: Sequence[Instance], *, batch_size: int = 1
    ) -> list[Observation]:
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        results: dict[int, Observation] = {}
        for chunk in batch_groups(instances, batch_size, self.label_set):
            observed = self._observe_batch([instances[i] for i in chunk])
            results.update(zip(chunk, observed, strict=True))
        return [results[index] for index in range(len(instances))]

    def prepare_batch(
        self,
        instances: Sequence[Instance],
        *,
        original_images: bool = False,
        variant: str | None = None,
    ) -> PreparedBatch:
        """Render, tokenise (left padding) and locate the candidate spans of instances with one
        N (``variant``: a prompt variant of the configured templates, see :meth:`messages_for`).

        ``original_images``: hand the processor the image files as they are, without the early
        shrink of large files (``posdebias check`` compares the two)."""
        for instance in instances:
            problem = self.task_problem(instance.task)
            if problem is not None:
                raise AdapterError(f"instance {instance.id!r}: {problem}")
        n = instances[0].n
        if any(instance.n != n for instance in instances):
            raise InputError("a batch must hold instances with the same number of candidates")
        if self.text_only and any(instance.all_images for instance in instances):
            raise InputError(
                f"{self.model_id or self.name} reads text only, but instance "
                f"{excerpt(next(i for i in instances if i.all_images).id)} has images; use a "
                "vision-language model for instances with images"
            )
        rendered = [self.render_with_spans(instance, variant=variant) for instance in instances]
        texts = [text for text, _ in rendered]
        side = None if original_images or self.text_only else min_image_side(self.processor)
        images = [
            [self._load_image(im, inst.id, side) for im in inst.all_images] for inst in instances
        ]
        _, plan = self.plan_for(n, texts[0], instances[0].task)
        with self.model_code(PROCESSOR_CALL):  # a family's own processor_inputs too
            inputs = self.processor_inputs(texts, images)
        offsets = inputs.pop("text_replacement_offsets", None)
        spans, image_spans = [], []
        covered = self.image_token_ids()
        for row, instance in enumerate(instances):
            ids = inputs["input_ids"][row].tolist()
            entries = _row_offsets(offsets, row)
            count = len(instance.all_images)
            row_images: list[ImageSpan] = []
            if count:
                replaced = None if entries is None else [e["replacement"] for e in entries]
                found = self.image_spans(ids, count, replaced)
                row_images = [as_span(s) for s in found]
                check_spans(row_images, ids, covered, count)
            image_spans.append(row_images)
            if not instance.has_texts and not instance.stem_images:
                spans.append(row_images)  # every candidate is an image: its span
                continue
            text_spans = self.text_spans(ids, texts[row], rendered[row][1], entries)
            row_spans = candidate_spans(instance, row_images, text_spans)
            check_candidate_spans(row_spans, ids, n)
            spans.append(row_spans)
        with self.model_code("position ids"):  # a family's may ask the model's own code
            positions = self.prompt_position_ids(inputs)
        inputs = inputs.to(self.device)
        model_dtype = getattr(self.model, "dtype", None)
        if model_dtype is not None and "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(model_dtype)
        return PreparedBatch(
            inputs=inputs,
            position_ids=positions.to(self.device),
            spans=spans,
            plan=plan,
            image_spans=image_spans,
        )

    def text_spans(
        self,
        input_ids: list[int],
        rendered: str,
        char_spans: Sequence[tuple[int, int] | None],
        replacements: list[dict[str, Any]] | None,
    ) -> list[list[int] | None]:
        """Token positions of each candidate's text in one prompt row (None: no text).

        The processor expands each image placeholder of ``rendered`` into the image's tokens;
        the text ranges move by the length the replacements before them add. The expanded prompt
        is tokenised once with offsets (it must give the row's own tokens), and a text's span is
        every token whose characters overlap the text's range (:func:`tokens_in_range`).
        """
        rendered, char_spans = self.processor_layout(rendered, char_spans)
        expanded, moved = expand_replacements(rendered, char_spans, replacements or [])
        encoded = self.tokenizer(
            expanded,
            return_offsets_mapping=True,
            add_special_tokens=self.prompt_special_tokens,
        )
        own = list(encoded["input_ids"])
        pad = len(input_ids) - len(own)
        if pad < 0 or input_ids[pad:] != own:
            raise AdapterError(
                f"the tokenizer of {self.model_id} gives other tokens for the prompt than its "
                "processor; posdebias cannot place the text spans"
            )
        offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
        return [
            None if span is None else [pad + t for t in tokens_in_range(offsets, span)]
            for span in moved
        ]

    def processor_layout(
        self, rendered: str, char_spans: Sequence[tuple[int, int] | None]
    ) -> tuple[str, list[tuple[int, int] | None]]:
        """The prompt as the processor lays it out before it expands the images, with the
        texts' character ranges moved along (default: as rendered). A processor that writes
        text of its own overrides it (PaliGemma: a BOS after the last image, a final newline)."""
        return rendered, list(char_spans)

    def run_batch(self, batch: PreparedBatch, *, attention: bool = True) -> tuple[Any, Any]:
        """One probed prompt forward + label scoring: ([B, N] scores, [B, L, N] attention).

        ``attention=False`` runs plain SDPA and returns ``None`` for the attention, the cost of
        a method that reads the label scores only (docs/performance.md compares the two).
        """

        import torch

        length = batch.inputs["input_ids"].shape[1]
        with torch.inference_mode():
            output, masses = self.prompt_forward(batch, attention=attention)
            cache = PromptCache(kv_cache(output), length)
            mask = batch.inputs["attention_mask"]

            processed = self.label_logits_processor(batch.inputs["input_ids"], mask)

            def decode(prefix: Prefix) -> Any:
                extra = self.decode_inputs(batch.inputs, len(prefix))
                logits = self._decode_step(prefix, mask, batch.position_ids, cache, length, extra)
                return processed(prefix, logits)

            scores = score_labels(batch.plan, processed((), output.logits[:, -1, :]), decode)
        return scores, masses

    def prompt_forward(
        self, batch: PreparedBatch, *, attention: bool = True, sofa: SofaSettings | None = None
    ) -> tuple[Any, Any]:
        """The prompt's forward with the KV cache kept, under SoFA with ``sofa``: the model's
        output and, with ``attention``, the probe's [B, L, N] masses (else None). A language
        model that keeps no cache of its own (Granite 4 Vision's layer-by-layer forward fills
        one it is given but makes none) is handed an empty one from then on, and the prompt
        runs again."""
        length = batch.inputs["input_ids"].shape[1]
        in_prompt = not self.cross_attention_layers
        while True:
            probe = (
                recording(span_matrix(batch.spans, length), self.cross_attention_spans(batch))
                if attention
                else contextlib.nullcontext()
            )
            given: dict[str, Any] = {}
            if self._gives_cache:
                from transformers import DynamicCache

                given = {self.cache_argument: DynamicCache(config=self.model.config)}
            with (
                sofa_attention(sofa) if sofa else contextlib.nullcontext(),
                probe as recorder,
                sofa_scope(batch.spans, length, images_in_prompt=in_prompt),
            ):
                output = self.model_forward(
                    **batch.inputs,
                    position_ids=batch.position_ids,
                    use_cache=True,
                    **self.last_logits_only,
                    **given,
                )
            if kv_cache(output) is not None or self._gives_cache:
                break
            self._gives_cache = True
        masses = recorder.attention(self.attention_layers) if recorder is not None else None
        return output, masses

    verify = verify_instance  # label scores against the model's own forward, cached per model

    def _observe_batch(self, instances: list[Instance]) -> list[Observation]:
        refuse_unsupported(self)
        batch = self.prepare_batch(instances)
        scores, attention = self.run_batch(batch)
        verify_first_batch(self, instances, batch, scores)  # once per model and adapter class
        self._last_n, self._last_task = instances[0].n, instances[0].task
        scores_np = scores.double().cpu().numpy()
        attention_np = attention.double().numpy()
        layers = self.attention_layers
        answers = [split_tie(row, instances[0].n) for row in scores_np]
        return [
            Observation(
                label_logprobs=answers[row][0],
                attention=attention_np[row],
                target=instance.target,
                layers=layers,
                span_lengths=np.array([len(span) for span in batch.spans[row]]),
                tie_logprob=answers[row][1],
            )
            for row, instance in enumerate(instances)
        ]

    def _load_image(self, reference: Any, instance_id: str, min_side: int | None = None) -> Any:
        """The image the processor gets: decoded (and resized to the ``image_size`` option), or
        a copy of the same file's image decoded before (keyed by the file's identity, so a
        rewritten file is read again)."""
        identity = file_identity(reference) if isinstance(reference, (str, Path)) else None
        key = None if identity is None else (*identity, min_side, self.options.image_size)
        if key is not None:
            with self._decoded_lock:
                seen = self._decoded.get(key)
                if seen is not None:
                    self._decoded.move_to_end(key)
            if seen is not None:
                return seen.copy()
        image = load_image(reference, instance_id, min_side)
        if self.options.image_size is not None:
            from PIL import Image

            size = (self.options.image_size, self.options.image_size)
            image = image.resize(size, Image.Resampling.BICUBIC)
        if key is None:
            return image
        with self._decoded_lock:
            self._decoded[key] = image
            if len(self._decoded) > DECODED_IMAGES:
                self._decoded.popitem(last=False)
        return image.copy()

    def label_logits_processor(self, prompt_ids: Any, mask: Any) -> LogitsProcessor:
        """``(prefix, logits) -> logits`` for label scoring: raw, or after the checkpoint's
        generation-config logits processors as greedy ``generate`` applies them (they see the
        prompt ids plus ``prefix``; left padding is ignored through the attention mask)."""
        if self.options.logits_processors == "none":
            return lambda prefix, logits: logits
        import torch

        with self.model_code(PROCESSORS_CALL):
            processors = generation_config_processors(self.model, prompt_ids, mask)

        def apply(prefix: Prefix, logits: Any) -> Any:
            extra = torch.tensor([list(prefix)] * prompt_ids.shape[0], dtype=prompt_ids.dtype)
            ids = torch.cat([prompt_ids, extra.to(prompt_ids.device)], dim=1)
            with self.model_code(PROCESSORS_CALL):
                return processors(ids, logits.float())

        return apply

    generate_many = generation.generate_many  # the adapter's samples, seeded per instance

    def _decode_step(
        self,
        prefix: Prefix,
        prompt_mask: Any,
        positions: Any,
        cache: PromptCache,
        length: int,
        extra: dict[str, Any],
    ) -> Any:
        """One cached decoding step: logits after ``prefix`` on top of the prompt's KV cache
        (``extra``: :meth:`decode_inputs`)."""
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
            **self.last_logits_only,
            **extra,
            **{self.cache_argument: cache.cache},
        )
        cache.rewind(k)  # back to the prompt for the next prefix (adapters/cache.py)
        return output.logits[:, -1, :]

    def describe(self, n: int | None = None) -> dict[str, Any]:
        import transformers

        extra = (
            {} if self.options.task_prompt is None else {"task_prompt": self.options.task_prompt}
        )
        described = {
            **extra,
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
            "prompt_hash": self.task_templates["retrieval"].digest(),
            "image_size": self.options.image_size,
            "logits_processors": self.options.logits_processors,
            "max_patches": self.options.max_patches,
            "prompt": self.task_templates["retrieval"].recorded(),
            "end_token": None
            if self.end_token_id is None
            else self.tokenizer.convert_ids_to_tokens(self.end_token_id),
            "answer_prefix": self.options.answer_prefix,
            "prompt_variant": self.prompt_variant,
            # a chat template given as an option changes every prompt: its digest is recorded
            "chat_template_sha256": None
            if self.options.chat_template is None or self.chat_template_override is None
            else hashlib.sha256(self.chat_template_override.encode()).hexdigest(),
            "transformers": transformers.__version__,
        }
        # a text-only model shows no image: its records name no image setting
        unused = self.image_options if self.text_only else ()
        return {k: v for k, v in described.items() if k not in unused}


def _two_token_tie(label: str, tokens: Sequence[int], model: str | None) -> str:
    return (
        f"task_prompt.tie_label {label!r} is {len(tokens)} tokens for {model or 'the model'}, "
        "not one; choose a tie label the tokenizer writes as one token (e.g. C)"
    )


def _row_offsets(offsets: Any, row: int) -> list[dict[str, Any]] | None:
    """The processor's image replacement entries of one row (span, new_span), or None."""
    if offsets is None:
        return None
    return [entry for entry in offsets[row] if entry.get("type") == "image"]


_PACKAGE = Path(__file__).resolve().parents[2]


def _raised_in_posdebias(exc: BaseException, adapter: type) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is posdebias's own code or the
    module of an adapter class (a plugin's family): then the error is ours or the plugin's,
    e.g. in the attention probe the model calls or in a family's own forward, not the
    model's."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    try:
        where = Path(tb.tb_frame.f_code.co_filename).resolve()
    except (OSError, ValueError):
        return False
    return where.is_relative_to(_PACKAGE) or where in _class_files(adapter)


def _class_files(adapter: type) -> set[Path]:
    """The source files of an adapter class and of the adapter classes it extends."""
    files = set()
    for cls in (c for c in adapter.__mro__ if issubclass(c, Adapter)):
        with contextlib.suppress(TypeError, OSError):  # a class made at run time has none
            files.add(Path(inspect.getfile(cls)).resolve())
    return files
