"""Idefics3 and SmolVLM: each image is split into tiles, every tile its own run of tokens.

With image splitting (the checkpoints' default) the processor puts, in place of one image,

    <fake_token_around_image><row_1_col_1><image> x L <fake_token_around_image><row_1_col_2> ...
    \\n  (after every row of tiles)
    \\n<fake_token_around_image><global-img><image> x L<fake_token_around_image>

(L = image_seq_len tokens per tile; without splitting only the last, global part). So one image
is several runs of ``<image>`` tokens and the default span finder, which expects one run per
image, finds five runs per image for 2 x 2 tiles. This adapter gives the spans itself
(:meth:`Idefics3Adapter.image_spans`): image k is the union of the runs of its own tokens, from
its first ``<fake_token_around_image>`` to the one that closes its global view: the image
tokens, the row/column markers, ``<global-img>`` and the ``<fake_token_around_image>`` markers,
but not the plain newline text tokens between rows of tiles. The language model is Llama with
1-D RoPE, so positions count from each row's first real token (the default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.spans import ImageSpan, SpanTokens
from posdebias.adapters.tiny import build_tokenizer, text_config
from posdebias.errors import AdapterError, InputError

MAX_TILES = 12  # row/column marker tokens looked up: <row_1_col_1> .. <row_12_col_12>


class Idefics3Adapter(HFAdapter):
    """Idefics3 / SmolVLM (``HuggingFaceTB/SmolVLM-Instruct``, ``SmolVLM2``, Idefics3-8B)."""

    name = "idefics3"
    model_types = ("idefics3", "smolvlm")
    summary = "Idefics3 / SmolVLM (images split into tiles: one span = all runs of one image)"

    def span_tokens(self) -> SpanTokens:
        ids = self.tokenizer.convert_tokens_to_ids
        processor = self.processor
        fake = getattr(processor, "fake_image_token", "<fake_token_around_image>")
        tag = getattr(processor, "global_image_tag", None)  # Idefics3; SmolVLM: _token
        self.global_token = self._token_id(
            str(tag or getattr(processor, "global_image_token", "<global-img>"))
        )
        self.fake_token = self._token_id(fake)
        markers = (
            ids(f"<row_{row}_col_{col}>")
            for row in range(1, MAX_TILES + 1)
            for col in range(1, MAX_TILES + 1)
        )
        unknown = {None, self.tokenizer.unk_token_id}
        self.tile_tokens = {token for token in markers if token not in unknown}
        return SpanTokens(image=self._token_id(self.image_token), start=self.fake_token)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise AdapterError(f"token {token!r} is not in the vocabulary of this tokenizer")
        return int(token_id)

    def image_token_ids(self) -> set[int]:
        return {self.tokens.image, self.fake_token, self.global_token, *self.tile_tokens}

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        """Image k: every image-owned token from its first tile to its closing marker."""
        owned = self.image_token_ids()
        spans: list[ImageSpan] = []
        current: list[int] = []
        in_global = False
        for position, token in enumerate(input_ids):
            if token not in owned:
                continue
            current.append(position)
            if token == self.global_token:
                in_global = True
            elif token == self.fake_token and in_global:
                spans.append(ImageSpan.from_positions(current))
                current, in_global = [], False
        if current or len(spans) != num_images:
            runs = sum(len(span.runs) for span in spans)
            raise AdapterError(
                f"found {len(spans)} complete images (tiles, then <global-img> and its closing "
                f"<fake_token_around_image>; {runs} runs of image tokens) for {num_images} "
                f"images{' and an unclosed one' if current else ''}: the chat template must "
                "render one <image> per image, and the processor must expand it the Idefics3 way"
            )
        return spans

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (toy vocabulary
        only)."""
        if real_vocabulary:
            raise InputError(
                "no real-vocabulary tiny model for Idefics3 / SmolVLM yet (toy vocabulary only)"
            )
        return _tiny_model(model_type)


# SmolVLM's chat template: "User:<image>...<end_of_utterance>\nAssistant:".
_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def _tiny_model(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText

    tiles = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
    tokenizer = build_tokenizer(
        [
            "<|im_start|>",
            "<|im_end|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<image>",
            "<global-img>",
            "<video>",
            "\n",  # the tiny tokenizer drops whitespace; real ones keep the row separators
            *tiles,
        ],
        chat_template=_TEMPLATE,
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        named_tokens={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    # The real checkpoints: longest edge resized to 4 x 364 (SmolVLM: 4 x 384), tiles of 364
    # (384), 169 (81) tokens per tile. Here: longest edge 128, 64 px tiles of 16 px patches,
    # pixel shuffle 2 -> (64 / 16)^2 / 2^2 = 4 tokens per tile, up to 2 x 2 tiles per image.
    tile, seq_len = 64, 4
    image_kwargs = {
        "size": {"longest_edge": 2 * tile},
        "max_image_size": {"longest_edge": tile},
        "do_image_splitting": True,
    }
    ids = tokenizer.convert_tokens_to_ids
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": tile, "patch_size": 16}  # fmt: skip
    text = text_config(
        len(tokenizer),
        model_type="llama",
        eos_token_id=ids("<end_of_utterance>"),
        pad_token_id=ids("<|im_end|>"),
        bos_token_id=None,
    )
    if family == "idefics3":
        from transformers.models.idefics3 import Idefics3ImageProcessor, Idefics3Processor

        processor = Idefics3Processor(
            image_processor=Idefics3ImageProcessor(**image_kwargs),
            tokenizer=tokenizer,
            image_seq_len=seq_len,
            chat_template=_TEMPLATE,
        )
    else:
        from transformers.models.smolvlm import (
            SmolVLMImageProcessor,
            SmolVLMProcessor,
            SmolVLMVideoProcessor,
        )

        processor = SmolVLMProcessor(
            image_processor=SmolVLMImageProcessor(**image_kwargs),
            tokenizer=tokenizer,
            video_processor=SmolVLMVideoProcessor(),
            image_seq_len=seq_len,
            chat_template=_TEMPLATE,
        )
    config = AutoConfig.for_model(
        family,
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(Idefics3Adapter)
