"""Choosing the N-1 distractors of an anchor: pure functions over indices and embeddings.

docs/benchmarks.md:

* random: N-1 distractors uniform from the pool, never the anchor, no duplicates;
* adversarial: drop pool images whose category set equals the anchor's (optionally also those
  whose categories contain all of the anchor's), drop those whose caption has cosine similarity
  >= a threshold (0.9) with the anchor's caption, then take the N-1 images most similar to the
  anchor image (CLIP embeddings, L2-normalised, so the dot product is the cosine).

Nothing here touches files or models, so the filters and the ranking are tested on hand-made
embeddings. Ties in similarity are broken by pool index, so the choice never depends on the
sort algorithm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from posdebias.errors import BenchmarkError

DEFAULT_CAPTION_THRESHOLD = 0.9


def random_distractors(rng: np.random.Generator, pool_size: int, anchor: int, k: int) -> np.ndarray:
    """``k`` distinct pool indices drawn uniformly, never ``anchor``."""
    if not 0 <= anchor < pool_size:
        raise BenchmarkError(f"anchor index {anchor} is outside the pool of {pool_size}")
    if k > pool_size - 1:
        raise BenchmarkError(
            f"the pool has {pool_size} images, too few for {k} distractors per instance; "
            "use a larger pool or a smaller N"
        )
    drawn = rng.choice(pool_size - 1, size=k, replace=False)
    return drawn + (drawn >= anchor)  # skip over the anchor


def category_keep_mask(
    categories: Sequence[frozenset[str]], anchor: int, *, drop_supersets: bool = False
) -> np.ndarray:
    """Which pool images survive the category filter for ``anchor`` (boolean [P]).

    Dropped: images whose category set equals the anchor's; with ``drop_supersets`` also those
    containing every category of the anchor (as the paper's reference code did). An anchor with
    no categories only drops other images without categories (the empty set is contained in
    every set, which would drop the whole pool).
    """
    target = categories[anchor]
    keep = np.fromiter(
        (
            not (cats == target or (drop_supersets and target and target <= cats))
            for cats in categories
        ),
        dtype=bool,
        count=len(categories),
    )
    keep[anchor] = False
    return keep


def max_caption_similarity(
    query_embedding: np.ndarray, caption_embeddings: np.ndarray, caption_offsets: np.ndarray
) -> np.ndarray:
    """Per pool image, the highest cosine between the query caption and any of its captions.

    ``caption_embeddings`` [C, D] holds the captions of all pool images, image by image;
    image ``p`` owns rows ``caption_offsets[p]:caption_offsets[p + 1]`` (each owns at least one).
    Using the maximum drops an image if any of its captions nearly repeats the query.
    """
    similarities = caption_embeddings @ query_embedding
    return np.maximum.reduceat(similarities, caption_offsets[:-1])


@dataclass(frozen=True)
class HardNegatives:
    """The chosen distractors (most image-similar first) and how many survived each filter."""

    indices: np.ndarray
    image_similarities: np.ndarray
    caption_similarities: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)


def select_hard_negatives(
    image_embeddings: np.ndarray,
    anchor: int,
    caption_similarity: np.ndarray,
    k: int,
    *,
    category_keep: np.ndarray | None = None,
    caption_threshold: float = DEFAULT_CAPTION_THRESHOLD,
    anchor_name: str | None = None,
) -> HardNegatives:
    """The ``k`` pool images most similar to the anchor image that pass both filters.

    Args:
        image_embeddings: [P, D] L2-normalised image embeddings of the pool.
        anchor: pool index of the anchor.
        caption_similarity: [P] cosine of the anchor's query caption with each image's captions
            (see :func:`max_caption_similarity`).
        k: number of distractors (N - 1).
        category_keep: [P] result of :func:`category_keep_mask`, or None to skip that filter
            (a source without categories).
        caption_threshold: images with caption similarity >= this are dropped.
        anchor_name: how to name the anchor in an error (default: its index).

    Raises:
        BenchmarkError: fewer than ``k`` images survive; the message gives the counts.
    """
    pool_size = image_embeddings.shape[0]
    image_similarity = image_embeddings @ image_embeddings[anchor]
    candidates = np.ones(pool_size, dtype=bool)
    candidates[anchor] = False
    if category_keep is not None:
        candidates &= category_keep
    after_category = int(candidates.sum())
    candidates &= caption_similarity < caption_threshold
    survivors = np.flatnonzero(candidates)
    counts = {
        "pool": pool_size - 1,
        "after_category_filter": after_category,
        "after_caption_filter": len(survivors),
    }
    if len(survivors) < k:
        name = anchor_name if anchor_name is not None else f"#{anchor}"
        category = (
            f"{after_category} pass the category filter, "
            if category_keep is not None
            else "no category filter, "
        )
        raise BenchmarkError(
            f"anchor image {name}: only {len(survivors)} of the {pool_size - 1} other pool images "
            f"survive the filters ({category}{len(survivors)} also have caption similarity < "
            f"{caption_threshold}), but N-1 = {k} distractors are needed. Use a larger pool, a "
            "smaller N, a higher caption threshold, or no superset category filter."
        )
    order = np.lexsort((survivors, -image_similarity[survivors]))[:k]
    chosen = survivors[order]
    return HardNegatives(
        indices=chosen,
        image_similarities=image_similarity[chosen],
        caption_similarities=caption_similarity[chosen],
        counts=counts,
    )
