"""Distractor selection on hand-made embeddings: the filters and the ranking, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from posdebias.benchmarks.selection import (
    category_keep_mask,
    max_caption_similarity,
    random_distractors,
    select_hard_negatives,
)
from posdebias.errors import BenchmarkError


def _unit(vectors):
    array = np.asarray(vectors, dtype=np.float32)
    return array / np.linalg.norm(array, axis=1, keepdims=True)


def test_random_distractors_are_uniform_distinct_and_never_the_anchor():
    rng = np.random.default_rng(0)
    counts = np.zeros(6)
    for _ in range(3000):
        chosen = random_distractors(rng, 6, 2, 3)
        assert 2 not in chosen and len(set(chosen.tolist())) == 3
        counts[chosen] += 1
    assert counts[2] == 0
    others = counts[[0, 1, 3, 4, 5]] / 3000
    assert np.allclose(others, 3 / 5, atol=0.03)  # each of the 5 others in 3/5 of draws
    again = random_distractors(np.random.default_rng(7), 10, 0, 9)
    assert sorted(again.tolist()) == list(range(1, 10))
    with pytest.raises(BenchmarkError, match="too few for 5 distractors"):
        random_distractors(rng, 5, 0, 5)


def test_category_filter_equal_and_superset():
    cats = [frozenset(c) for c in (["dog"], ["dog"], ["dog", "couch"], ["cat"], [], ["couch"])]
    assert category_keep_mask(cats, 0).tolist() == [False, False, True, True, True, True]
    assert category_keep_mask(cats, 0, drop_supersets=True).tolist() == [
        False,
        False,
        False,
        True,
        True,
        True,
    ]
    # an anchor without objects only drops other images without objects
    assert category_keep_mask(cats, 4, drop_supersets=True).tolist() == [
        True,
        True,
        True,
        True,
        False,
        True,
    ]


def test_max_caption_similarity_per_image():
    query = np.array([1.0, 0.0], dtype=np.float32)
    captions = _unit([[1, 0], [0, 1], [0, 1], [1, 1], [-1, 0]])
    offsets = np.array([0, 2, 4, 5])  # image 0: rows 0-1, image 1: rows 2-3, image 2: row 4
    result = max_caption_similarity(query, captions, offsets)
    assert np.allclose(result, [1.0, np.sqrt(0.5), -1.0])


def test_hard_negatives_filter_then_rank_by_image_similarity():
    # anchor 0 points along x; the others at decreasing angles
    angles = np.deg2rad([0, 10, 20, 30, 40, 50, 60, 70])
    images = _unit(np.stack([np.cos(angles), np.sin(angles)], axis=1))
    caption_sim = np.array([1.0, 0.95, 0.2, 0.3, 0.9, 0.1, 0.0, 0.5])
    keep = np.array([False, True, True, False, True, True, True, True])  # 3 has anchor's cats
    chosen = select_hard_negatives(images, 0, caption_sim, 3, category_keep=keep)
    # 1 dropped (caption 0.95 >= 0.9), 3 dropped (category), 4 dropped (0.9 is >= threshold)
    assert chosen.indices.tolist() == [2, 5, 6]
    assert np.allclose(chosen.image_similarities, np.cos(np.deg2rad([20, 50, 60])))
    assert np.allclose(chosen.caption_similarities, [0.2, 0.1, 0.0])
    assert chosen.counts == {"pool": 7, "after_category_filter": 6, "after_caption_filter": 4}
    # no category filter (Flickr8k); a higher threshold keeps image 4 (0.9 < 0.95)
    chosen = select_hard_negatives(images, 0, caption_sim, 3, caption_threshold=0.95)
    assert chosen.indices.tolist() == [2, 3, 4]


def test_ties_are_broken_by_pool_index():
    images = _unit([[1, 0], [0, 1], [1, 0], [0, 1], [1, 0]])
    chosen = select_hard_negatives(images, 0, np.zeros(5), 3)
    assert chosen.indices.tolist() == [2, 4, 1]


def test_too_few_survivors_names_the_anchor_and_the_counts():
    images = _unit([[1, 0], [0, 1], [1, 1], [1, 2]])
    keep = np.array([False, True, False, True])
    with pytest.raises(BenchmarkError) as info:
        select_hard_negatives(
            images,
            0,
            np.array([1.0, 0.95, 0.0, 0.0]),
            2,
            category_keep=keep,
            anchor_name="42 (COCO_42.jpg)",
        )
    message = str(info.value)
    assert "anchor image 42 (COCO_42.jpg)" in message
    assert "only 1 of the 3 other pool images" in message
    assert "2 pass the category filter" in message and "N-1 = 2" in message
