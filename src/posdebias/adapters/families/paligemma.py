"""PaliGemma (1 and 2): the images first, then a prefix the model reads BIDIRECTIONALLY.

The checkpoints' processors have no chat template: the prompt is the images' ``<image>``
placeholders and the text, and the processor itself inserts the BOS after the last image and a
newline at the end (:data:`PROMPT_FORMAT` renders the messages that way). Each image becomes a
run of ``<image>`` tokens; the runs of consecutive images touch, so they are split by the
processor's per-image counts.

The processor's ``token_type_ids`` mark the whole prompt as the prefix (0): the model attends
bidirectionally within it, causally from the answer (1) on. What the observations read is
unchanged: the last prompt token's row is the last row of the prefix, whose mask is every prompt
token either way, so its attention mass on image k is what it is for a causal model; what
differs is what the keys hold: every prompt token, the images' included, has seen the whole
prompt, the caption after the images too. The probe reads the model's own mask (checked against
eager attention by ``posdebias check``). The label tokens are the answer (token type 1), as
``generate`` appends them: the cached decoding steps attend causally, and the reference forward
of the verification marks them 1 (:meth:`PaliGemmaAdapter.extended_inputs`).

Two more differences from the default: positions count from 1 (PaliGemma's are 1-indexed), and
the processor's training ``labels`` (returned for every prompt) are dropped, since a forward
given labels computes a loss over every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter

#: PaliGemma's prompt, for processors without a chat template: every message's images and
#: texts in order; the processor adds the BOS after the last image and the final newline.
PROMPT_FORMAT = (
    "{% for message in messages %}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<image>{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


class PaliGemmaAdapter(HFAdapter):
    """PaliGemma / PaliGemma 2 (``google/paligemma2-3b-mix-448`` and relatives)."""

    name = "paligemma"
    model_types = ("paligemma",)
    summary = "PaliGemma 1 / 2 (bidirectional prefix; runs of <image> split by counts)"
    split_by_processor_counts = True
    default_chat_template = PROMPT_FORMAT

    def processor_inputs(self, texts: list[str], images: list[list[Any]]) -> Any:
        inputs = super().processor_inputs(texts, images)
        inputs.pop("labels", None)  # the processor's training targets: no loss is wanted
        return inputs

    def processor_layout(
        self, rendered: str, char_spans: Sequence[tuple[int, int] | None]
    ) -> tuple[str, list[tuple[int, int] | None]]:
        """The processor inserts the BOS after the last image placeholder and ends the prompt
        with a newline before it expands the images; the texts' characters move with it."""
        cut = rendered.rfind(self.processor.image_token)
        if cut < 0:  # the processor refuses prompts without images
            return rendered, list(char_spans)
        cut += len(self.processor.image_token)
        bos = str(self.tokenizer.bos_token)
        moved = [
            None
            if span is None
            else (span[0] + len(bos), span[1] + len(bos))
            if span[0] >= cut
            else span
            for span in char_spans
        ]
        return rendered[:cut] + bos + rendered[cut:] + "\n", moved

    def prompt_position_ids(self, inputs: Any) -> Any:
        """1-indexed positions, as PaliGemma's own forward counts them."""
        return super().prompt_position_ids(inputs) + 1

    def extended_inputs(self, inputs: dict[str, Any], extra: Any) -> dict[str, Any]:
        """Appended tokens are the answer: token type 1, outside the bidirectional prefix."""
        full = super().extended_inputs(inputs, extra)
        if "token_type_ids" in full:
            full["token_type_ids"][:, inputs["input_ids"].shape[1] :] = 1
        return full


posdebias_register_adapters = register_hook(PaliGemmaAdapter)
