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

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import ImageSpan, SpanTokens
from posdebias.errors import AdapterError

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
        self.global_token = self.vocabulary_id(
            str(tag or getattr(processor, "global_image_token", "<global-img>"))
        )
        self.fake_token = self.vocabulary_id(fake)
        markers = (
            ids(f"<row_{row}_col_{col}>")
            for row in range(1, MAX_TILES + 1)
            for col in range(1, MAX_TILES + 1)
        )
        unknown = {None, self.tokenizer.unk_token_id}
        self.tile_tokens = {token for token in markers if token not in unknown}
        return SpanTokens(image=self.vocabulary_id(self.image_token), start=self.fake_token)

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


posdebias_register_adapters = register_hook(Idefics3Adapter)
