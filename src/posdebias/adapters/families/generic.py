"""The fallback for any ``AutoModelForImageTextToText`` no specific adapter claims.

It needs a processor with a chat template and an ``image_token``; each image's span is its
run of image tokens as the processor expanded it (split by the processor's own per-image
counts), widened by the processor's ``start_image_token`` / ``end_image_token`` when it declares
them. Position ids are counted from the attention mask, which is right for 1-D RoPE language
models only.

What the generic adapter cannot read right is refused BEFORE the first forward
(:meth:`GenericAdapter.support_problem`), from the config, the model's modules and one dry run of
the processor on two small generated images (a square and a wide one, so that a tiling processor
tiles): a model that computes its own positions (multimodal RoPE), reads images through
cross-attention layers, shares key/value states between layers, has layer types without a known
attention kind, answers through a separate decoder (an encoder-decoder, a block-diffusion
canvas), or attends bidirectionally over a prefix; a processor
that returns no replacement offsets, whose image token is only a placeholder for other tokens,
or that splits an image into tiles with text between them. Anything else the first-batch
verification catches (verify.py) stops the run: the generic adapter never guesses.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from posdebias._images import min_image_side
from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.layers import attention_layers
from posdebias.adapters.hf.spans import SpanTokens, position_runs
from posdebias.core.instance import Instance
from posdebias.errors import PosdebiasError

_POSITION_METHODS = ("get_rope_index", "compute_3d_position_ids", "get_position_ids")


def own_position_scheme(model: Any) -> str | None:
    """How ``model`` computes non-1-D positions itself, or None when it uses token indices."""
    for owner in (model, getattr(model, "model", None)):
        for method in _POSITION_METHODS:
            if owner is not None and callable(getattr(owner, method, None)):
                return f"it computes its own position ids ({type(owner).__name__}.{method})"
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and ({"mrope_section", "mrope_interleaved"} & set(rope)):
        return "its language model uses multimodal RoPE (mrope_section in rope_parameters)"
    return None


def structural_problem(config: Any, model_class: Any = None) -> str | None:
    """What in a model's config (and, given, its class) the generic adapter cannot read right,
    or None. Needs no weights and no processor, so the coverage table can ask it of every
    family (``posdebias plugins --families``)."""
    if getattr(config, "is_encoder_decoder", False):
        return (
            "it is an encoder-decoder model: the answer comes from a separate decoder whose "
            "prompt is not the images and the text"
        )
    decoder_only = getattr(config, "use_decoder_only_language_model", False)  # BLIP-2 on OPT
    if model_class is not None and not decoder_only and _takes_decoder_inputs(model_class):
        return (
            f"{model_class.__name__} answers through a separate decoder (its forward takes "
            "decoder_input_ids: an encoder-decoder or a block-diffusion canvas), not by "
            "continuing the prompt"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cross = getattr(text, "cross_attention_layers", None) or getattr(
        config, "cross_attention_layers", None
    )
    if cross:
        return (
            f"it reads images through cross-attention layers {list(cross)}, which the "
            "self-attention probe does not see; it needs a family adapter that reads "
            "cross-attention"
        )
    shared = getattr(text, "num_kv_shared_layers", 0) or 0
    if isinstance(shared, int) and shared > 0:
        return (
            f"its last {shared} layers reuse other layers' key/value states (KV sharing), "
            "which the generic adapter is not checked on; it needs a family adapter that is "
            "(Gemma 4 has one)"
        )
    if getattr(text, "num_hidden_layers", None) is not None:
        try:
            attention_layers(text)
        except PosdebiasError as exc:
            return str(exc)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and ({"mrope_section", "mrope_interleaved"} & set(rope)):
        return "its language model uses multimodal RoPE (mrope_section in rope_parameters)"
    if model_class is not None:
        for owner in _classes_of(model_class):
            for method in _POSITION_METHODS:
                if callable(getattr(owner, method, None)):
                    return f"it computes its own position ids ({owner.__name__}.{method})"
    return None


def _takes_decoder_inputs(model_class: Any) -> bool:
    forward = getattr(model_class, "forward", None)
    try:
        return forward is not None and "decoder_input_ids" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a forward without a signature: nothing to read
        return False


def _classes_of(model_class: Any) -> list[Any]:
    """The model class and the base ``*Model`` classes of its module (its inner model)."""
    module = importlib.import_module(model_class.__module__)
    inner = [
        value
        for name, value in vars(module).items()
        if isinstance(value, type)
        and name.endswith("Model")
        and not name.endswith("PreTrainedModel")
        and value.__module__ == module.__name__
    ]
    return [model_class, *inner]


class GenericAdapter(HFAdapter):
    """Any image-text-to-text model with a chat template and an image token."""

    name = "generic"
    model_types = ()
    summary = "any AutoModelForImageTextToText with a chat template and an image token"
    split_by_processor_counts = True

    @classmethod
    def language_config_key(cls, model: Any) -> str | None:
        """``text_config``, or None where the config holds no text config of its own and is the
        language model's (Chameleon: a flat config beside its VQ image tokenizer's)."""
        config = model.config
        flat = getattr(config, "text_config", None) is None and config.get_text_config() is config
        return None if flat else cls.text_config_key

    def span_tokens(self) -> SpanTokens:
        base = super().span_tokens()
        markers = []
        for attribute in ("start_image_token", "end_image_token"):
            token = getattr(self.processor, attribute, None)
            token_id = self.tokenizer.convert_tokens_to_ids(token) if token else None
            markers.append(None if token_id in (None, self.tokenizer.unk_token_id) else token_id)
        return SpanTokens(image=base.image, start=markers[0], end=markers[1])

    def position_problem(self) -> str | None:
        scheme = own_position_scheme(self.model)
        if scheme is None:
            return None
        return f"{scheme}, and the generic adapter only counts 1-D positions"

    def support_problem(self) -> str | None:
        """Everything the generic adapter can tell it would read wrong, before any forward:
        the config and modules (:func:`structural_problem`), then one processor dry run."""
        return self._support_verdict

    @functools.cached_property
    def _support_verdict(self) -> str | None:
        return (
            self.position_problem()
            or structural_problem(self.model.config, type(self.model))
            or self._cross_attention_modules()
            or self._processor_problem()
        )

    def _cross_attention_modules(self) -> str | None:
        """Cross-attention inside the language model (where it reads the images); a projector
        that pools vision features with cross-attention (Aria) is the vision side's own."""
        get_decoder = getattr(self.model, "get_decoder", None)
        decoder = get_decoder() if callable(get_decoder) else None
        modules = (decoder if decoder is not None else self.model).named_modules()
        names = [name for name, _ in modules if name.endswith("cross_attn")]
        if not names:
            return None
        return (
            f"its language model has {len(names)} cross-attention module(s) ({names[0]}, ...), "
            "which the self-attention probe does not read"
        )

    def _processor_problem(self) -> str | None:
        """One processor call on two small generated images (one of them wide), no model
        forward: are the replacement offsets there, is the image token expanded, one run per
        image?"""
        from PIL import Image

        side = min(max(min_image_side(self.processor) or 64, 16), 448)
        # a square image and a wide one: a processor that tiles large or wide images shows it
        sizes = ((side, side), (2 * side, side))
        colours = ((200, 30, 30), (30, 30, 200))
        images = tuple(Image.new("RGB", size, c) for size, c in zip(sizes, colours, strict=True))
        probe = Instance(stem="a red or a blue image", images=images, target=None, id="dry")
        try:
            inputs = self.processor_inputs([self.render(probe)], [list(images)])
        except PosdebiasError as exc:
            return f"its processor rejected two small images: {exc}"
        # token types mark bidirectional blocks: images (1, Gemma 3) or the whole prompt as a
        # prefix (0, PaliGemma), so a forward that takes them is enough to refuse
        takes_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        types = inputs.get("token_type_ids")
        if types is not None and (takes_types or int(types.sum()) > 0):
            return (
                "its processor marks bidirectional attention blocks (token_type_ids: a prefix "
                "or image blocks), which the causal probe and the cached label steps do not "
                "reproduce"
            )
        offsets = inputs.get("text_replacement_offsets")
        if offsets is None:
            return (
                f"{type(self.processor).__name__} returns no text replacement offsets, so the "
                "generic adapter cannot tell which tokens belong to which image"
            )
        replacements = [e["replacement"] for e in offsets[0] if e.get("type") == "image"]
        ids = inputs["input_ids"][0].tolist()
        image_id = self.tokens.image
        if replacements and all(r.count(self.image_token) <= 1 for r in replacements):
            total = sum(1 for t in ids if t == image_id)
            return (
                f"its image token {self.image_token!r} is a placeholder ({total} in a prompt "
                "with 2 images): the image's features sit on other tokens, which the generic "
                "adapter cannot attribute to an image"
            )
        runs = position_runs(t for t, token in enumerate(ids) if token == image_id)
        if len(runs) > len(replacements):
            return (
                f"its processor splits images into tiles with text between them ({len(runs)} "
                f"runs of image tokens for {len(replacements)} images); a family adapter must "
                "say which tokens belong to each image"
            )
        return None


posdebias_register_adapters = register_hook(GenericAdapter)
