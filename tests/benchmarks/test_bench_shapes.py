"""The bundled shapes generator: deterministic, exact captions, a COCO-format folder."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from pydantic import ValidationError

from posdebias.benchmarks.shapes import (
    CAPTIONS_FILE,
    INSTANCES_FILE,
    ShapeAttributes,
    ShapeObject,
    ShapeSpace,
    caption_for,
    captions_for,
    generate_shapes_dataset,
    iter_shape_samples,
    render_shape_image,
    sample_shape_attributes,
)
from posdebias.errors import BenchmarkError

GRAMMAR = re.compile(
    r"^a (small|medium|large) \w+ \w+ at the \w+( and a (small|medium|large) \w+ \w+ at the \w+)*"
    r" on a \w+ background$"
)


def _files(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    a = _files(generate_shapes_dataset(tmp_path / "a", 30, seed=3))
    b = _files(generate_shapes_dataset(tmp_path / "b", 30, seed=3))
    c = _files(generate_shapes_dataset(tmp_path / "c", 30, seed=4))
    assert a == b
    assert len(a) == 33  # 30 images + 2 annotation files + the marker
    assert a[CAPTIONS_FILE] != c[CAPTIONS_FILE]


def test_coco_layout_captions_and_categories(tmp_path):
    space = ShapeSpace()
    root = generate_shapes_dataset(tmp_path / "s", 40, seed=0)
    captions = json.loads((root / CAPTIONS_FILE).read_text())
    instances = json.loads((root / INSTANCES_FILE).read_text())
    assert [im["id"] for im in captions["images"]] == list(range(1, 41))
    assert all((root / im["file_name"]).is_file() for im in captions["images"])
    vocabulary = set(space.vocabulary())
    texts = [a["caption"] for a in captions["annotations"]]
    for text in texts:
        assert GRAMMAR.match(text), text
        assert set(text.split(" ")) <= vocabulary
    # every image has one caption per object (rotations of the object order)
    per_image = {}
    for ann in captions["annotations"]:
        per_image.setdefault(ann["image_id"], []).append(ann["caption"])
    objects = {}
    for ann in instances["annotations"]:
        objects.setdefault(ann["image_id"], []).append(ann["category_id"])
    names = {cat["id"]: cat["name"] for cat in instances["categories"]}
    assert [names[i] for i in sorted(names)] == list(space.shapes)
    for image_id, caps in per_image.items():
        assert len(caps) == len(objects[image_id])
        for category_id in objects[image_id]:
            assert all(names[category_id] in cap for cap in caps)
    # canonical captions are unique: no instance can have two correct images
    first = [caps[0] for caps in per_image.values()]
    assert len(set(first)) == len(first)
    assert any(len(caps) == 2 for caps in per_image.values())


def test_render_draws_the_caption():
    circle = ShapeObject("circle", "red", "large", "center", (220, 40, 40), (0.5, 0.5), 0.5)
    attributes = ShapeAttributes((circle,), "white", (245, 245, 245))
    image = render_shape_image(attributes, 64)
    assert image.size == (64, 64)
    assert image.getpixel((32, 32)) == (220, 40, 40)
    assert image.getpixel((2, 2)) == (245, 245, 245)
    assert caption_for(attributes) == "a large red circle at the center on a white background"
    big = render_shape_image(attributes, 96)
    assert big.size == (96, 96)


def test_samples_are_seeded_and_objects_ordered_by_position():
    space = ShapeSpace(max_objects=3, min_objects=3)
    first = [sample_shape_attributes(np.random.default_rng(5), space) for _ in range(2)]
    assert first[0] == first[1]
    order = list(space.positions)
    for attrs in (sample_shape_attributes(np.random.default_rng(s), space) for s in range(20)):
        positions = [order.index(o.position) for o in attrs.objects]
        assert positions == sorted(positions) and len(set(positions)) == 3
        assert len(captions_for(attrs)) == 3
        assert captions_for(attrs)[0] == caption_for(attrs)
        for obj in attrs.objects:  # never invisible on its background
            assert obj.colour in space.colours_on(attrs.background)
    stream_a = iter_shape_samples(seed=1, image_size=32)
    stream_b = iter_shape_samples(seed=1, image_size=32)
    for _ in range(3):
        a, b = next(stream_a), next(stream_b)
        assert a.caption == b.caption and a.image.tobytes() == b.image.tobytes()


def test_configurable_space_and_vocabulary():
    space = ShapeSpace(
        colours={"dark red": (120, 0, 0), "cyan": (0, 200, 200)},
        shapes=("hexagon", "ring"),
        sizes={"tiny": 0.2},
        positions={"top left": (0.3, 0.3), "bottom right": (0.7, 0.7)},
        backgrounds={"white": (255, 255, 255)},
        max_objects=1,
    )
    assert space.vocabulary() == sorted(
        {
            "a",
            "and",
            "at",
            "background",
            "on",
            "the",
            "dark",
            "red",
            "cyan",
            "hexagon",
            "ring",
            "tiny",
            "top",
            "left",
            "bottom",
            "right",
            "white",
        }
    )
    attrs = sample_shape_attributes(np.random.default_rng(0), space)
    assert set(caption_for(attrs).split(" ")) <= set(space.vocabulary())
    assert render_shape_image(attrs, 32).size == (32, 32)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shapes": ("circle", "blob")}, "unknown shape kinds"),
        ({"colours": {"Red!": (255, 0, 0)}}, "lowercase words"),
        ({"max_objects": 6}, "positions"),
        ({"backgrounds": {"red": (220, 40, 40)}, "colours": {"red": (220, 40, 40)}}, "visible"),
    ],
)
def test_bad_space_is_rejected(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        ShapeSpace(**kwargs)


def test_folder_reuse_replace_and_refusal(tmp_path):
    root = generate_shapes_dataset(tmp_path / "s", 10, seed=0)
    stamp = (root / CAPTIONS_FILE).stat().st_mtime_ns
    generate_shapes_dataset(root, 10, seed=0)  # same dataset: reused, not rewritten
    assert (root / CAPTIONS_FILE).stat().st_mtime_ns == stamp
    generate_shapes_dataset(root, 5, seed=1)  # another shapes dataset: replaced, no stale images
    assert len(list((root / "images").iterdir())) == 5
    foreign = tmp_path / "coco"
    foreign.mkdir()
    (foreign / "keep.jpg").write_bytes(b"x")
    with pytest.raises(BenchmarkError, match="not empty and is not a shapes dataset"):
        generate_shapes_dataset(foreign, 5, seed=0)
    assert (foreign / "keep.jpg").read_bytes() == b"x"


def test_too_many_images_for_the_space_is_a_clear_error(tmp_path):
    space = ShapeSpace(
        colours={"red": (220, 40, 40)},
        shapes=("circle",),
        sizes={"small": 0.3},
        positions={"center": (0.5, 0.5)},
        backgrounds={"white": (255, 255, 255)},
        max_objects=1,
    )
    with pytest.raises(BenchmarkError, match="distinct captions"):
        generate_shapes_dataset(tmp_path / "s", 2, seed=0, space=space)
    assert not (tmp_path / "s").exists()


def test_a_huge_count_on_a_small_space_is_refused_at_once():
    """The draws stop once the space is exhausted (20,000 repeats in a row), not after 50
    draws per image asked for (for 100,000 images, minutes of drawing)."""
    import time

    from posdebias.benchmarks.shapes import sample_unique_attributes

    space = ShapeSpace(
        colours={"red": (220, 40, 40), "blue": (40, 40, 220)},
        shapes=("circle", "square"),
        sizes={"small": 0.3},
        positions={"center": (0.5, 0.5)},
        backgrounds={"white": (255, 255, 255)},
        max_objects=1,
    )
    started = time.perf_counter()
    with pytest.raises(BenchmarkError, match="gives only about 4 distinct captions"):
        sample_unique_attributes(100_000, 0, space)
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize("meanwhile", ["a folder of the user's", "a file", "the same dataset"])
def test_a_root_made_while_a_build_stages_is_checked_again_at_the_swap(tmp_path, meanwhile):
    """The root was checked only before staging: a folder the user made meanwhile was moved
    aside at the swap and deleted with the staging leftovers."""
    from posdebias.benchmarks.shapes import stage_shapes_dataset

    root = tmp_path / "R"
    staged = stage_shapes_dataset(root, 4, seed=3)
    if meanwhile == "a folder of the user's":
        root.mkdir()
        (root / "mine.txt").write_text("precious")
    elif meanwhile == "a file":
        root.write_text("precious")
    else:  # another build of the same settings finished first: replacing it is harmless
        generate_shapes_dataset(root, 4, seed=3)
    try:
        if meanwhile == "the same dataset":
            staged.commit(keep_old=True)
        else:
            with pytest.raises(BenchmarkError, match="shapes"):
                staged.commit(keep_old=True)
    finally:
        staged.discard()
    if meanwhile == "a folder of the user's":
        assert sorted(p.name for p in root.iterdir()) == ["mine.txt"]
    elif meanwhile == "a file":
        assert root.read_text() == "precious"
    else:
        assert len(list((root / "images").iterdir())) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R"]  # no staging folder left
