"""Readers of the real on-disk formats: COCO, both Flickr8k layouts, JSONL; clear errors."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from posdebias.benchmarks.sources import read_coco, read_flickr8k, read_jsonl, read_source
from posdebias.errors import BenchmarkError


def write_image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(path)


def _coco(tmp_path, *, images=None, captions=None, with_instances=True):
    root = tmp_path / "val2014"
    ann = tmp_path / "annotations"
    ann.mkdir(parents=True)
    images = images or [
        {"id": 42, "file_name": "COCO_val2014_000000000042.jpg"},
        {"id": 7, "file_name": "COCO_val2014_000000000007.jpg"},
        {"id": 9, "file_name": "COCO_val2014_000000000009.jpg"},
    ]
    for image in images:
        write_image(root / image["file_name"])
    captions = captions or [
        {"id": 1, "image_id": 42, "caption": "A dog  on a couch.\n"},
        {"id": 2, "image_id": 7, "caption": "Two cats sleeping."},
        {"id": 3, "image_id": 42, "caption": "A brown dog lies on a sofa."},
        {"id": 4, "image_id": 9, "caption": "A bowl of fruit."},
    ]
    (ann / "captions_val2014.json").write_text(
        json.dumps({"images": images, "annotations": captions})
    )
    if with_instances:
        instances = {
            "images": images,
            "categories": [
                {"id": 18, "name": "dog"},
                {"id": 17, "name": "cat"},
                {"id": 63, "name": "couch"},
            ],
            "annotations": [
                {"id": 1, "image_id": 42, "category_id": 63},
                {"id": 2, "image_id": 42, "category_id": 18},
                {"id": 3, "image_id": 42, "category_id": 18},
                {"id": 4, "image_id": 7, "category_id": 17},
            ],
        }
        (ann / "instances_val2014.json").write_text(json.dumps(instances))
    return root


def test_coco_several_captions_and_categories_found_beside_the_root(tmp_path):
    root = _coco(tmp_path)
    pool = read_coco(root)  # annotations/ found in root/.. ; instances beside captions
    assert pool.kind == "coco" and pool.root == root.resolve()
    assert [image.image_id for image in pool.images] == ["7", "9", "42"]  # sorted by id
    dog = pool.images[2]
    assert dog.path == "COCO_val2014_000000000042.jpg"
    assert dog.captions == ("A dog on a couch.", "A brown dog lies on a sofa.")
    assert dog.categories == ("couch", "dog")
    assert pool.images[1].categories == ()  # no objects annotated: an empty set, not None
    assert pool.has_categories
    assert [p.name for p in pool.annotation_files] == [
        "captions_val2014.json",
        "instances_val2014.json",
    ]


def test_coco_without_instances_has_no_categories(tmp_path):
    root = _coco(tmp_path, with_instances=False)
    pool = read_coco(root, tmp_path / "annotations" / "captions_val2014.json")
    assert not pool.has_categories
    assert all(image.categories is None for image in pool.images)


def test_coco_missing_image_is_named_and_can_be_skipped(tmp_path):
    root = _coco(tmp_path)
    (root / "COCO_val2014_000000000007.jpg").unlink()
    with pytest.raises(BenchmarkError) as info:
        read_coco(root)
    message = str(info.value)
    assert "1 of 3 images" in message and "COCO_val2014_000000000007.jpg" in message
    assert "--skip-missing-images" in message
    pool = read_coco(root, skip_missing=True)
    assert [image.image_id for image in pool.images] == ["9", "42"]
    assert pool.skipped_missing == ("COCO_val2014_000000000007.jpg",)


def test_coco_image_without_caption_and_bad_annotations_are_all_reported(tmp_path):
    captions = [
        {"id": 1, "image_id": 42, "caption": "A dog."},
        {"id": 2, "image_id": 999, "caption": "Nobody's image."},
        {"id": 3, "image_id": 42, "caption": "   "},
    ]
    root = _coco(tmp_path, captions=captions)
    with pytest.raises(BenchmarkError) as info:
        read_coco(root)
    message = str(info.value)
    assert "annotations[1]: image_id 999 is not in the images list" in message
    assert "annotations[2] (image 42): caption is missing or empty" in message
    captions = [{"id": 1, "image_id": 42, "caption": "A dog."}]
    (tmp_path / "annotations" / "captions_val2014.json").unlink()
    root = _coco(tmp_path / "second", captions=captions)
    with pytest.raises(BenchmarkError, match="image id 7 has no caption") as info:
        read_coco(root)
    assert "image id 9 has no caption" in str(info.value)


def test_coco_malformed_json_gives_line_and_column(tmp_path):
    root = _coco(tmp_path)
    path = tmp_path / "annotations" / "captions_val2014.json"
    path.write_text('{"images": [\n  {"id": 1,, }\n]}')
    with pytest.raises(BenchmarkError, match=r"captions_val2014.json:2:\d+: .*not valid JSON"):
        read_coco(root)
    path.write_text('{"images": 3}')
    with pytest.raises(BenchmarkError, match="needs a 'images' list"):
        read_coco(root)


def test_coco_unknown_category_and_ambiguous_captions_file(tmp_path):
    root = _coco(tmp_path)
    instances = tmp_path / "annotations" / "instances_val2014.json"
    payload = json.loads(instances.read_text())
    payload["annotations"].append({"id": 9, "image_id": 7, "category_id": 1234})
    instances.write_text(json.dumps(payload))
    with pytest.raises(BenchmarkError, match="annotations\\[4\\]: unknown category_id 1234"):
        read_coco(root)
    (tmp_path / "annotations" / "captions_train2014.json").write_text("{}")
    with pytest.raises(BenchmarkError, match="several COCO captions file"):
        read_coco(root)


def _flickr_images(tmp_path):
    root = tmp_path / "Images"
    for name in ("1000268201_693b08cb0e.jpg", "1001773457_577c3a7d70.jpg"):
        write_image(root / name)
    return root


def test_flickr8k_token_format(tmp_path):
    root = _flickr_images(tmp_path)
    token = tmp_path / "Flickr8k.token.txt"
    token.write_text(
        "1000268201_693b08cb0e.jpg#1\tA girl going into a wooden building .\n"
        "1000268201_693b08cb0e.jpg#0\tA child in a pink dress is climbing up stairs .\n"
        "1001773457_577c3a7d70.jpg#0\tA black dog and a spotted dog are fighting\n"
    )
    pool = read_flickr8k(root)  # found in root/..
    assert [image.image_id for image in pool.images] == [
        "1000268201_693b08cb0e.jpg",
        "1001773457_577c3a7d70.jpg",
    ]
    assert pool.images[0].captions == (  # ordered by the #k index, not file order
        "A child in a pink dress is climbing up stairs .",
        "A girl going into a wooden building .",
    )
    assert not pool.has_categories and pool.images[0].categories is None


def test_flickr8k_csv_format_with_commas(tmp_path):
    root = _flickr_images(tmp_path)
    csv_file = tmp_path / "captions.txt"
    csv_file.write_text(
        "image,caption\n"
        '1000268201_693b08cb0e.jpg,"A child, in pink, climbs stairs ."\n'
        "1000268201_693b08cb0e.jpg,A girl going into a wooden building , smiling .\n"
        "1001773457_577c3a7d70.jpg,Two dogs .\n"
    )
    pool = read_source("flickr8k", root, csv_file)
    assert pool.images[0].captions == (
        "A child, in pink, climbs stairs .",
        "A girl going into a wooden building , smiling .",
    )
    assert pool.images[1].captions == ("Two dogs .",)


def test_flickr8k_errors_have_line_numbers(tmp_path):
    root = _flickr_images(tmp_path)
    token = tmp_path / "Flickr8k.token.txt"
    token.write_text(
        "1000268201_693b08cb0e.jpg#0\tA child .\n"
        "1001773457_577c3a7d70.jpg#x\tbad index\n"
        "1001773457_577c3a7d70.jpg#1\t   \n"
        "2258277193_586949ec62.jpg.1#0\tan image that is not there\n"
    )
    with pytest.raises(BenchmarkError) as info:
        read_flickr8k(root, token)
    message = str(info.value)
    assert "line 2: expected 'name.jpg#k<TAB>caption'" in message
    assert "line 3: empty caption" in message
    token.write_text("1000268201_693b08cb0e.jpg#0\tA child .\n2258277193_586949ec62.jpg.1#0\tx\n")
    with pytest.raises(BenchmarkError, match=r"2258277193_586949ec62\.jpg\.1"):
        read_flickr8k(root, token)
    token.write_text("just some text\n")
    with pytest.raises(BenchmarkError, match="not a Flickr8k captions file"):
        read_flickr8k(root, token)
    with pytest.raises(BenchmarkError, match="does not exist; check --captions"):
        read_flickr8k(root, tmp_path / "nope.txt")


def test_jsonl_source_merges_captions_and_checks_lines(tmp_path):
    root = tmp_path / "imgs"
    write_image(root / "a.png")
    write_image(root / "sub" / "b.png")
    data = tmp_path / "data.jsonl"
    lines = [
        {"image": "sub/b.png", "caption": "a blue thing", "categories": ["thing", "blue"]},
        {"image": "a.png", "caption": "a red thing", "categories": ["thing"]},
        {"image": "sub/b.png", "caption": "something blue", "categories": ["blue", "thing"]},
    ]
    data.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    pool = read_jsonl(root, data)
    assert [image.path for image in pool.images] == ["sub/b.png", "a.png"]  # file order
    assert pool.images[0].captions == ("a blue thing", "something blue")
    assert pool.images[0].categories == ("blue", "thing")
    bad = [
        '{"image": "a.png", "caption": "x"}',
        "not json",
        '{"image": "../escape.png", "caption": "x"}',
        '{"image": "sub/b.png", "captions": "typo"}',
        '{"image": "a.png", "caption": "y", "categories": "thing"}',
        '{"image": "sub/b.png", "caption": "z", "categories": ["thing"]}',
    ]
    data.write_text("\n".join(bad) + "\n")
    with pytest.raises(BenchmarkError) as info:
        read_jsonl(root, data)
    message = str(info.value)
    for expected in (
        "line 2: not valid JSON",
        "line 3: image '../escape.png' is outside the root",
        "line 4: unknown keys ['captions']",
        "line 5: 'categories' must be a list",
        "line 1: a.png has no categories but other images do",
    ):
        assert expected in message
    with pytest.raises(BenchmarkError, match="pass it with --captions"):
        read_jsonl(root, None)


def test_shapes_folder_is_read_by_the_coco_reader(shapes_root):
    pool = read_source("shapes", shapes_root)
    assert pool.kind == "shapes" and len(pool.images) == 60 and pool.has_categories
    assert pool.images[0].path == "images/000001.png"
    two_objects = [image for image in pool.images if len(image.captions) == 2]
    assert two_objects and all(1 <= len(image.categories) <= 2 for image in two_objects)
