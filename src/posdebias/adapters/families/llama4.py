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

from typing import Any

from posdebias._markers import register_hook
from posdebias.adapters.hf import BatchingUnsafe, HFAdapter, PreparedBatch
from posdebias.adapters.hf.spans import SpanTokens
from posdebias.core.instance import Instance
from posdebias.core.observation import Observation


class PaddingChangesNumbers(BatchingUnsafe):
    """A padded batch whose numbers would differ from its rows alone (see the module doc)."""


class Llama4Adapter(HFAdapter):
    """Llama 4 (``meta-llama/Llama-4-Scout-17B-16E-Instruct`` and relatives)."""

    name = "llama4"
    model_types = ("llama4",)
    summary = "Llama 4 (chunked-attention + global NoPE layers)"
    marked_layout = "<|image_start|> tiles and global view <|image_end|>"

    def span_tokens(self) -> SpanTokens:
        ids = self.tokenizer.convert_tokens_to_ids
        return SpanTokens(
            image=int(self.model.config.image_token_id),
            start=int(ids(self.processor.start_of_img_token)),
            end=int(ids(self.processor.end_of_img_token)),
        )

    def own_forward(self, **inputs: Any) -> Any:
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

    def _observe_batch(self, instances: list[Instance]) -> list[Observation]:
        try:
            return super()._observe_batch(instances)
        except PaddingChangesNumbers:
            # a loop, not a comprehension: zero-argument super() needs the method's own scope
            observed: list[Observation] = []
            for one in instances:
                observed.extend(super()._observe_batch([one]))
            return observed

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


posdebias_register_adapters = register_hook(Llama4Adapter)
