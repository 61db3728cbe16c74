"""Where each image's tokens are: the spans R_k of METHOD.md "Observations".

Every family expands one placeholder per image into a run of image tokens; they differ in the
markers around the run and in whether consecutive images' runs touch:

* Qwen2-VL / Qwen2.5-VL: ``<|vision_start|>`` + run of ``<|image_pad|>`` + ``<|vision_end|>``.
* InternVL: ``<img>`` + ``<IMG_CONTEXT>`` x 256 per tile + ``</img>``.
* LLaVA-OneVision: no markers; in multi-image mode all images form ONE contiguous run of
  ``<image>`` (each image's share ends with its image-newline token).
* LLaVA: runs of ``<image>``, which touch when two images are adjacent in the prompt.

:func:`find_image_spans` handles all of them: it splits the image-token positions into per-image
groups (by the processor's own per-image token counts when given, else by contiguous runs),
widens each group by an adjacent start / end marker, and fails loudly when the number of spans is
not the number of images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from posdebias.errors import AdapterError


@dataclass(frozen=True)
class SpanTokens:
    """Token ids that make up an image span (markers optional)."""

    image: int
    start: int | None = None
    end: int | None = None


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def find_image_spans(
    input_ids: Sequence[int] | Any,
    tokens: SpanTokens,
    num_images: int,
    *,
    tokens_per_image: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """Half-open token ranges [start, end) of each image, in prompt order.

    Args:
        input_ids: one sequence (padding included; pad tokens are never image tokens).
        tokens: the image token and optional start / end marker tokens.
        num_images: how many images the prompt holds (N).
        tokens_per_image: image tokens of each image, as the processor expanded them; needed when
            runs touch (LLaVA-OneVision, adjacent LLaVA images). Without it each contiguous run is
            one image.

    Raises:
        AdapterError: when the spans found are not exactly ``num_images``.
    """
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    positions = [index for index, token in enumerate(ids) if token == tokens.image]
    if tokens_per_image is not None:
        counts = list(tokens_per_image)
        if len(counts) != num_images or sum(counts) != len(positions):
            raise AdapterError(
                f"found {len(positions)} image tokens (id {tokens.image}), but the processor "
                f"expanded {len(counts)} images into {sum(counts)} tokens and the prompt has "
                f"{num_images} images; the chat template or processor does not match the model"
            )
        groups: list[tuple[int, int]] = []
        cursor = 0
        for count in counts:
            chunk = positions[cursor : cursor + count]
            if count < 1 or chunk[-1] - chunk[0] + 1 != count:
                raise AdapterError(
                    f"the tokens of image {len(groups) + 1} are not contiguous; "
                    "cannot form its span"
                )
            groups.append((chunk[0], chunk[-1] + 1))
            cursor += count
    else:
        groups = _runs(positions)
    if len(groups) != num_images:
        raise AdapterError(
            f"found {len(groups)} image-token spans (token id {tokens.image}) for {num_images} "
            "images; the chat template must render one image placeholder per image"
        )
    spans = []
    for start, end in groups:
        if tokens.start is not None and start > 0 and ids[start - 1] == tokens.start:
            start -= 1
        if tokens.end is not None and end < len(ids) and ids[end] == tokens.end:
            end += 1
        spans.append((start, end))
    return spans


def span_matrix(spans: Sequence[Sequence[tuple[int, int]]], length: int) -> torch.Tensor:
    """[B, T, N] float32 indicator of the spans of each batch row (the probe's reducer)."""
    import torch

    batch = len(spans)
    n = max(len(row) for row in spans)
    matrix = torch.zeros(batch, length, n, dtype=torch.float32)
    for row, row_spans in enumerate(spans):
        for image, (start, end) in enumerate(row_spans):
            matrix[row, start:end, image] = 1.0
    return matrix
