"""Where each image's tokens are: the spans R_k of docs/method.md, "Observations".

An :class:`ImageSpan` is ALL the tokens that belong to one image: one run of consecutive
positions, or the union of several (a family that splits an image into tiles with text between
them). The probe's span matrix and the attention mass of image k are computed over exactly these
tokens. An adapter gives them with its ``image_spans`` hook (:class:`HFAdapter`);
:func:`check_spans` validates what any hook returns. Most families expand one placeholder per
image into a run of image tokens and differ only in the markers around the run and in whether
consecutive images' runs touch:

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

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
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

    @classmethod
    def named(cls, holder: Any, image: str, start: str, end: str) -> SpanTokens:
        """The three ids ``holder`` (a model config or a processor) keeps under these names."""
        return cls(*(int(getattr(holder, name)) for name in (image, start, end)))


Run = tuple[int, int]


@dataclass(frozen=True)
class ImageSpan:
    """All tokens of one image: sorted, disjoint, non-empty half-open runs [start, end).

    ``ImageSpan.of(start, end)`` is one contiguous run; ``ImageSpan(((a, b), (c, d)))`` a union
    (e.g. an image's tiles without the text between them).
    """

    runs: tuple[Run, ...]

    def __post_init__(self) -> None:
        runs = tuple((int(start), int(end)) for start, end in self.runs)
        if not runs:
            raise AdapterError("an image span needs at least one run of tokens")
        previous = -1
        for start, end in runs:
            if start < 0 or end <= start or start < previous:
                raise AdapterError(
                    f"image span runs must be non-empty, sorted and disjoint, got {list(runs)}"
                )
            previous = end
        object.__setattr__(self, "runs", runs)

    @classmethod
    def of(cls, start: int, end: int) -> ImageSpan:
        """One contiguous run [start, end)."""
        return cls(((start, end),))

    @classmethod
    def from_positions(cls, positions: Iterable[int]) -> ImageSpan:
        """The span of these token positions (grouped into runs)."""
        return cls(tuple(position_runs(sorted(set(positions)))))

    @property
    def start(self) -> int:
        return self.runs[0][0]

    @property
    def end(self) -> int:
        return self.runs[-1][1]

    def __len__(self) -> int:
        return sum(end - start for start, end in self.runs)

    def positions(self) -> list[int]:
        """Every token position of the span, in order."""
        return [t for start, end in self.runs for t in range(start, end)]

    def shifted(self, offset: int) -> ImageSpan:
        return ImageSpan(tuple((start + offset, end + offset) for start, end in self.runs))


def as_span(span: ImageSpan | Sequence[int]) -> ImageSpan:
    """An :class:`ImageSpan` from a span or a plain ``(start, end)`` pair."""
    if isinstance(span, ImageSpan):
        return span
    start, end = span
    return ImageSpan.of(start, end)


def position_runs(positions: Iterable[int]) -> list[tuple[int, int]]:
    """The runs ``[start, end)`` of consecutive ``positions`` (ascending), in order."""
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
) -> list[ImageSpan]:
    """The span of each image (one contiguous run, markers included), in prompt order.

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
                runs = len(position_runs(positions))
                raise AdapterError(
                    f"the {count} tokens of image {len(groups) + 1} are not one run; "
                    + span_count_message(runs, num_images, tokens.image)
                )
            groups.append((chunk[0], chunk[-1] + 1))
            cursor += count
    else:
        groups = position_runs(positions)
    if len(groups) != num_images:
        raise AdapterError(span_count_message(len(groups), num_images, tokens.image))
    spans = []
    for start, end in groups:
        if tokens.start is not None and start > 0 and ids[start - 1] == tokens.start:
            start -= 1
        if tokens.end is not None and end < len(ids) and ids[end] == tokens.end:
            end += 1
        spans.append(ImageSpan.of(start, end))
    return spans


def span_count_message(runs: int, num_images: int, image_token: int) -> str:
    """What was found and its likely cause, when runs of image tokens are not one per image."""
    found = f"found {runs} runs of image tokens (token id {image_token}) for {num_images} images"
    if runs == 0:
        return (
            f"{found}: the prompt has no image tokens; the chat template must render one image "
            "placeholder per image"
        )
    if runs > num_images:
        return (
            f"{found}: does this family split images into tiles (or put other tokens inside an "
            "image)? Its adapter must give the spans itself (the image_spans hook, see the "
            "Adapters page of the documentation)"
        )
    return (
        f"{found}: runs of adjacent images touch, or the chat template drops image placeholders; "
        "split runs by the processor's per-image counts (split_by_processor_counts) or check "
        "the chat template renders one placeholder per image"
    )


def check_spans(
    spans: Sequence[ImageSpan],
    input_ids: Sequence[int] | Any,
    image_tokens: Iterable[int],
    num_images: int,
) -> str:
    """Validate one prompt's spans; returns a one-line summary, raises :class:`AdapterError`.

    The rules every adapter's spans obey: one span per image, in prompt order and disjoint
    (image k's tokens all come before image k+1's), inside the prompt, and together they hold
    every token of ``image_tokens`` exactly once.
    """
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    if len(spans) != num_images:
        raise AdapterError(f"the adapter gave {len(spans)} image spans for {num_images} images")
    for index, span in enumerate(spans):
        if span.end > len(ids):
            raise AdapterError(
                f"image {index + 1}'s span {list(span.runs)} ends after the prompt ({len(ids)} "
                "tokens)"
            )
        if index and span.start < spans[index - 1].end:
            raise AdapterError(
                f"image spans overlap or are out of prompt order: image {index} ends at "
                f"{spans[index - 1].end}, image {index + 1} starts at {span.start}"
            )
    wanted = set(image_tokens)
    image_positions = {t for t, token in enumerate(ids) if token in wanted}
    covered = {t for span in spans for t in span.positions()}
    missing = sorted(image_positions - covered)
    if missing:
        raise AdapterError(
            f"{len(missing)} image tokens belong to no image span (first at position "
            f"{missing[0]}); the spans must cover every image token"
        )
    sizes = sorted({len(span) for span in spans})
    size_text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    runs = sum(len(span.runs) for span in spans)
    return (
        f"{num_images} spans in order, {size_text} tokens each, {runs} runs, "
        f"{len(image_positions)} image tokens covered once"
    )


def span_matrix(
    spans: Sequence[Sequence[ImageSpan | tuple[int, int]]], length: int
) -> torch.Tensor:
    """[B, T, N] float32 indicator of every token of each image (the probe's reducer)."""
    import torch

    batch = len(spans)
    n = max(len(row) for row in spans)
    matrix = torch.zeros(batch, length, n, dtype=torch.float32)
    for row, row_spans in enumerate(spans):
        for image, span in enumerate(row_spans):
            for start, end in as_span(span).runs:
                matrix[row, start:end, image] = 1.0
    return matrix


def find_closed_spans(
    input_ids: Sequence[int] | Any, owned: set[int], closing: int, num_images: int, layout: str
) -> list[ImageSpan]:
    """Spans of layouts where each image is a block of its own tokens ended by one marker.

    Every token in ``owned`` belongs to the image being read; ``closing`` ends it (Pixtral's
    ``[IMG_END]`` after rows of ``[IMG]`` separated by ``[IMG_BREAK]``). Tokens outside ``owned``
    inside a block are left out, so a span may be a union of runs. ``layout`` names the expected
    layout in the error.
    """
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    spans: list[ImageSpan] = []
    current: list[int] = []
    for position, token in enumerate(ids):
        if token in owned:
            current.append(position)
            if token == closing:
                spans.append(ImageSpan.from_positions(current))
                current = []
    if current or len(spans) != num_images:
        unclosed = " and an unclosed one" if current else ""
        raise AdapterError(
            f"found {len(spans)} complete images ({layout}){unclosed} for {num_images} images: "
            "the chat template must render one image placeholder per image, and the processor "
            "must expand it in this family's layout"
        )
    return spans


def find_marked_spans(
    input_ids: Sequence[int] | Any,
    start: int | Collection[int],
    end: int,
    num_images: int,
    layout: str,
    *,
    blocks_per_image: int = 1,
) -> list[ImageSpan]:
    """Spans of layouts where the processor writes each image between a start and an end
    marker: image k is everything from its start marker to its end marker, both included
    (tiles, tile labels, separators, the global view, Kimi's ``image`` word: the processor or
    the chat template wrote all of it for this image). ``start`` may be several marker ids (any
    opens a block). With ``blocks_per_image`` > 1 an image is that many blocks back to back
    (Molmo 2's low- and high-resolution views), its span from its first block's start to its
    last block's end. ``layout`` names the expected layout in the error."""
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    opening = {start} if isinstance(start, int) else set(start)
    starts = [t for t, token in enumerate(ids) if token in opening]
    ends = [t + 1 for t, token in enumerate(ids) if token == end]
    pairs = list(zip(starts, ends, strict=False))
    nested = any(not a < b for a, b in pairs) or any(
        previous[1] > following[0] for previous, following in pairwise(pairs)
    )
    expected = num_images * blocks_per_image
    if len(starts) != expected or len(ends) != expected or nested:
        per_image = f" of {blocks_per_image} blocks each" if blocks_per_image > 1 else ""
        raise AdapterError(
            f"found {len(starts)} image starts and {len(ends)} image ends"
            f"{' out of order' if nested else ''} for {num_images} images{per_image} ({layout}): "
            "the chat template must render one image placeholder per image"
        )
    spans = []
    for image in range(num_images):
        group = pairs[image * blocks_per_image : (image + 1) * blocks_per_image]
        for (_, previous_end), (next_start, _) in pairwise(group):
            if next_start != previous_end:
                raise AdapterError(
                    f"the {blocks_per_image} blocks of image {image + 1} ({layout}) are not "
                    "back to back: other tokens stand between them"
                )
        spans.append(ImageSpan.of(group[0][0], group[-1][1]))
    return spans


# -- candidate spans (any task) ---------------------------------------------------------------


def expand_replacements(
    rendered: str,
    char_spans: Sequence[tuple[int, int] | None],
    replacements: Sequence[dict[str, Any]],
) -> tuple[str, list[tuple[int, int] | None]]:
    """The prompt as the processor expanded it (each image placeholder replaced by its
    ``replacement``) and the character ranges moved along.

    ``replacements``: the processor's entries (``span`` of the placeholder in ``rendered``,
    ``replacement`` text), in prompt order. A range moves by the length the replacements
    before it add; a range overlapping a placeholder is an error (a text is never an image).
    """
    pieces: list[str] = []
    cursor = 0
    shifts: list[tuple[int, int]] = []  # (placeholder end in rendered, total shift after it)
    total = 0
    for entry in replacements:
        start, end = (int(v) for v in entry["span"])
        if start < cursor or rendered[start:end] != entry.get("text", rendered[start:end]):
            raise AdapterError("the processor's replacement offsets do not match the prompt")
        pieces.append(rendered[cursor:start])
        pieces.append(entry["replacement"])
        total += len(entry["replacement"]) - (end - start)
        shifts.append((end, total))
        cursor = end
    pieces.append(rendered[cursor:])
    moved: list[tuple[int, int] | None] = []
    for span in char_spans:
        if span is None:
            moved.append(None)
            continue
        start, end = span
        shift = 0
        for (placeholder_end, after), entry in zip(shifts, replacements, strict=True):
            placeholder_start = int(entry["span"][0])
            if placeholder_start < end and placeholder_end > start:
                raise AdapterError("a candidate's text overlaps an image placeholder")
            if placeholder_end <= start:
                shift = after
        moved.append((start + shift, end + shift))
    return "".join(pieces), moved


def tokens_in_range(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of the tokens whose characters overlap ``span`` = [start, end).

    A token that holds a character of the text belongs to its span; tokens made only of the
    label, punctuation or separators around it do not (zero-width tokens, e.g. a BOS, never).
    """
    start, end = span
    return [t for t, (a, b) in enumerate(offsets) if b > a and a < end and b > start]


def candidate_spans(
    instance: Any,
    image_spans: Sequence[ImageSpan],
    text_positions: Sequence[Sequence[int] | None],
) -> list[ImageSpan]:
    """Each candidate's span: its image's tokens (the stem's images come first among
    ``image_spans``), its text's tokens, or both."""
    spans: list[ImageSpan] = []
    image = len(instance.stem_images)
    for k, candidate in enumerate(instance.candidates):
        positions: list[int] = []
        if candidate.image is not None:
            positions += image_spans[image].positions()
            image += 1
        if candidate.text is not None:
            tokens = text_positions[k] or []
            if not tokens:
                raise AdapterError(f"candidate {k + 1}'s text has no token in the prompt")
            positions += list(tokens)
        spans.append(ImageSpan.from_positions(positions))
    return spans


def check_candidate_spans(
    spans: Sequence[ImageSpan], input_ids: Sequence[int] | Any, num_candidates: int
) -> str:
    """Validate one prompt's candidate spans: one non-empty span per candidate, inside the
    prompt, disjoint; returns a one-line summary, raises :class:`AdapterError`."""
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    if len(spans) != num_candidates:
        raise AdapterError(f"the adapter gave {len(spans)} spans for {num_candidates} candidates")
    seen: set[int] = set()
    for index, span in enumerate(spans):
        if span.end > len(ids):
            raise AdapterError(
                f"candidate {index + 1}'s span {list(span.runs)} ends after the prompt "
                f"({len(ids)} tokens)"
            )
        positions = set(span.positions())
        if positions & seen:
            raise AdapterError(f"candidate {index + 1}'s span overlaps another candidate's")
        seen |= positions
    sizes = sorted({len(span) for span in spans})
    size_text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{num_candidates} candidate spans, disjoint, {size_text} tokens each"
