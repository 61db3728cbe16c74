"""Llama 4: chunked-attention layers with RoPE, and global NoPE layers every fourth layer.

Each image becomes ``<|image_start|>`` (tile patches and separators when the image is tiled)
``<|image|>`` + ``<|patch|>`` x 144 + ``<|image_end|>``; the model replaces the ``<|patch|>``
tokens. The span of an image is everything from its ``<|image_start|>`` to its
``<|image_end|>``: every tile and the global view.

Layers whose ``no_rope_layers`` entry is 1 use RoPE and ``chunked_attention``: the last prompt
token sees only the tokens of its own chunk (``attention_chunk_size``, 8,192 in the
checkpoints, counted from each row's first real token), so images in earlier chunks get zero
mass there. Every fourth layer is a global NoPE layer. The probe reads all of them with the
model's own masks; layer selection keeps to the global ones by default.

NoPE layers scale their queries by a temperature that grows with the token's index counted from
the start of the padded row (``attn_temperature_tuning``); it is 1 below ``floor_scale`` (8,192)
tokens. Beyond that, left padding would change a row's numbers, so batches whose padded prompt
reach ``floor_scale`` are run one instance at a time (the model's own forward has the same
dependence on padding; the adapter's numbers never depend on the batch size).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter, PreparedBatch
from posdebias.adapters.spans import ImageSpan, SpanTokens
from posdebias.adapters.tiny import build_tokenizer, text_config
from posdebias.core.instance import RetrievalInstance
from posdebias.core.observation import Observation
from posdebias.errors import AdapterError, InputError


class PaddingChangesNumbers(AdapterError):
    """A padded batch whose numbers would differ from its rows alone (see the module doc)."""


class Llama4Adapter(HFAdapter):
    """Llama 4 (``meta-llama/Llama-4-Scout-17B-16E-Instruct`` and relatives)."""

    name = "llama4"
    model_types = ("llama4",)
    summary = "Llama 4 (chunked-attention + global NoPE layers)"

    def span_tokens(self) -> SpanTokens:
        ids = self.tokenizer.convert_tokens_to_ids
        return SpanTokens(
            image=int(self.model.config.image_token_id),
            start=int(ids(self.processor.start_of_img_token)),
            end=int(ids(self.processor.end_of_img_token)),
        )

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """From each ``<|image_start|>`` to its ``<|image_end|>``: every tile's patches, the
        separators and the global view of one image."""
        tokens = self.tokens
        starts = [i for i, token in enumerate(input_ids) if token == tokens.start]
        ends = [i for i, token in enumerate(input_ids) if token == tokens.end]
        spans = list(zip(starts, [end + 1 for end in ends], strict=False))
        if (
            len(starts) != num_images
            or len(ends) != num_images
            or any(not start < end for start, end in spans)
            or any(a[1] > b[0] for a, b in pairwise(spans))
        ):
            raise AdapterError(
                f"found {len(starts)} <|image_start|> and {len(ends)} <|image_end|> markers "
                f"for {num_images} images; the chat template must render one image placeholder "
                "per image"
            )
        return [ImageSpan.of(start, end) for start, end in spans]

    def model_forward(self, **inputs: Any) -> Any:
        """The conditional-generation forward, composed from the model's own parts.

        ``Llama4ForConditionalGeneration.forward`` of transformers 5.x builds its output from
        an attribute (``image_outputs``) the language model's output does not have, so every
        call fails. This runs what it runs before that line: the vision model, the projector,
        the image features scattered over the ``<|patch|>`` embeddings, then the language
        model (with its own masks, cache and ``logits_to_keep``).
        """
        model = self.model
        input_ids = inputs.pop("input_ids")
        pixel_values = inputs.pop("pixel_values", None)
        embeds = model.get_input_embeddings()(input_ids)
        if pixel_values is not None:
            features = model.get_image_features(pixel_values=pixel_values, return_dict=True)
            flat = features.last_hidden_state.reshape(-1, features.last_hidden_state.shape[-1])
            projected = model.multi_modal_projector(flat).to(embeds.device, embeds.dtype)
            where = model.get_placeholder_mask(
                input_ids, inputs_embeds=embeds, image_features=projected
            )
            embeds = embeds.masked_scatter(where, projected)
        return model.language_model(inputs_embeds=embeds, **inputs)

    def run_batch(self, batch: PreparedBatch, *, attention: bool = True) -> tuple[Any, Any]:
        if self._temperature_sees_padding(batch):
            raise PaddingChangesNumbers(
                f"a padded Llama 4 batch of {batch.inputs['input_ids'].shape[1]} tokens reaches "
                f"floor_scale ({self._text_config.floor_scale}): the NoPE layers' query "
                "temperature would count the padding; run these instances one at a time"
            )
        return super().run_batch(batch, attention=attention)

    def _observe_batch(self, instances: list[RetrievalInstance]) -> list[Observation]:
        try:
            return super()._observe_batch(instances)
        except PaddingChangesNumbers:
            return [obs for one in instances for obs in super()._observe_batch([one])]

    def _temperature_sees_padding(self, batch: PreparedBatch) -> bool:
        """True when the NoPE layers' query temperature would differ with padding: it is 1 for
        token indices below ``floor_scale``, so only padded batches that reach it differ."""
        config = self._text_config
        mask = batch.inputs["attention_mask"]
        return (
            bool(getattr(config, "attn_temperature_tuning", False))
            and mask.shape[1] >= int(config.floor_scale) - 1
            and not bool(mask.bool().all())
        )

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (the tiny BPE
        vocabulary only)."""
        if real_vocabulary:
            raise InputError(f"no real-vocabulary tiny model for {model_type!r}")
        return _tiny_model()


_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|header_start|>{{ message['role'] }}"
    "<|header_end|>\n\n{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<|image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|eot|>{% endfor %}{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>"
    "\n\n{% endif %}"
)

TINY_CHUNK_SIZE = 52
"""The tiny model's attention chunk, shorter than the prompt: at N = 8 with a short caption
(about 100 tokens) the last chunk starts inside the seventh image, at N = 3 (about 70 tokens)
after the last image."""


def _tiny_model() -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.llama4 import Llama4ImageProcessor, Llama4Processor

    tokenizer = build_tokenizer(
        [
            "<|begin_of_text|>",
            "<|eot|>",
            "<|finetune_right_pad|>",
            "<|header_start|>",
            "<|header_end|>",
            "<|image_start|>",
            "<|image_end|>",
            "<|image|>",
            "<|patch|>",
            "<|tile_x_separator|>",
            "<|tile_y_separator|>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<|eot|>",
        pad_token="<|finetune_right_pad|>",
        bos_token="<|begin_of_text|>",
    )
    # 56 px tiles of 14 px patches: 4 x 4 patches, pixel shuffle 0.5 -> 4 tokens per tile.
    size = 56
    image_processor = Llama4ImageProcessor(size={"height": size, "width": size}, max_patches=4)
    processor = Llama4Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        pixel_shuffle_ratio=0.5,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    # 8 layers in the checkpoints' pattern: 3 chunked RoPE layers, then 1 global NoPE layer.
    text = {
        "model_type": "llama4_text",
        **text_config(len(tokenizer), num_hidden_layers=8, head_dim=16),
        "intermediate_size_mlp": 128,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "no_rope_layer_interval": 4,
        "attention_chunk_size": TINY_CHUNK_SIZE,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "bos_token_id": ids("<|begin_of_text|>"),
        "eos_token_id": ids("<|eot|>"),
        "pad_token_id": ids("<|finetune_right_pad|>"),
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 128,  # 4 x hidden: the pixel shuffle's output width, as the real
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": size,
        "patch_size": 14,
        "pixel_shuffle_ratio": 0.5,
        "vision_output_dim": 32,
        "projector_input_dim": 32,
        "projector_output_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    config = AutoConfig.for_model(
        "llama4",
        text_config=text,
        vision_config=vision,
        boi_token_index=ids("<|image_start|>"),
        eoi_token_index=ids("<|image_end|>"),
        image_token_index=ids("<|patch|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(Llama4Adapter)
