"""Building benchmarks end to end on the bundled shapes: determinism, invariants, loading, CLI."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from helpers import build_from_options as build
from posdebias.benchmarks.files import BENCHMARK_FILE, MANIFEST_FILE, load_benchmark
from posdebias.benchmarks.sources import read_source
from posdebias.cli import main
from posdebias.errors import BenchmarkError


def _bytes(folder):
    return (folder / BENCHMARK_FILE).read_bytes(), (folder / MANIFEST_FILE).read_bytes()


def _adversarial(shapes_root, out, clip_config, cache, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build(
            "coco",
            shapes_root,
            out,
            setting="adversarial",
            clip_model=str(clip_config),
            clip_pretrained="none",
            cache_dir=cache,
            device="cpu",
            **options,
        )


def test_random_build_is_byte_identical_and_valid(shapes_root, tmp_path):
    options = {"setting": "random", "n": 5, "count": 40, "seed": 11}
    build("coco", shapes_root, tmp_path / "a", **options)
    build("coco", shapes_root, tmp_path / "b", **options)
    build("coco", shapes_root, tmp_path / "c", **{**options, "seed": 12})
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b")
    assert _bytes(tmp_path / "a")[0] != _bytes(tmp_path / "c")[0]

    bench = load_benchmark(tmp_path / "a")
    pool = {image.path: image for image in read_source("shapes", shapes_root).images}
    assert len(bench) == 40 and bench.manifest.n == 5 and bench.root == shapes_root.resolve()
    anchors = [inst.metadata["anchor_image_id"] for inst in bench.instances]
    assert len(set(anchors)) == 40  # each image anchors at most one instance
    targets = [inst.target for inst in bench.instances]
    assert len(set(targets)) > 1  # the anchor is not always in the same position
    for inst in bench.instances:
        anchor = pool[inst.candidate_ids[inst.target]]
        assert anchor.image_id == inst.metadata["anchor_image_id"]
        assert inst.stem == anchor.captions[inst.metadata["caption_index"]]
        assert inst.n == 5 and len(set(inst.candidate_ids)) == 5
        assert all(
            str(shapes_root.resolve() / rel) == path
            for rel, path in zip(inst.candidate_ids, inst.images, strict=True)
        )
        assert "similarities" not in inst.metadata
    manifest = json.loads((tmp_path / "a" / MANIFEST_FILE).read_text())
    assert manifest["setting"] == "random" and manifest["seed"] == 11 and manifest["clip"] is None
    assert [f["path"].rsplit("/", 1)[1] for f in manifest["source"]["annotation_files"]] == [
        "captions_shapes.json",
        "instances_shapes.json",
    ]


def test_adversarial_build_picks_the_most_similar_allowed_images(
    shapes_root, tmp_path, tiny_clip, tiny_clip_config
):
    cache = tmp_path / "cache"
    report = _adversarial(
        shapes_root,
        tmp_path / "a",
        tiny_clip_config,
        cache,
        n=4,
        count=20,
        seed=3,
        drop_category_supersets=True,
    )
    assert sorted(report.cache_misses) == ["images", "texts"] and report.cache_hits == []
    bench = load_benchmark(tmp_path / "a")
    pool = read_source("shapes", shapes_root).images
    index = {image.path: i for i, image in enumerate(pool)}
    emb = tiny_clip.encode_images([shapes_root / image.path for image in pool])
    texts = [c for image in pool for c in image.captions]
    text_emb = tiny_clip.encode_texts(texts)
    owner = np.repeat(np.arange(len(pool)), [len(image.captions) for image in pool])
    for inst in bench.instances:
        a = index[inst.candidate_ids[inst.target]]
        anchor_cats = set(pool[a].categories)
        query = text_emb[texts.index(inst.stem)]
        allowed = []
        for j, image in enumerate(pool):
            caption_max = max(text_emb[owner == j] @ query)
            if j == a or anchor_cats <= set(image.categories) or caption_max >= 0.9:
                continue
            allowed.append((-float(emb[j] @ emb[a]), j))
        expected = {j for _, j in sorted(allowed)[:3]}
        chosen = {index[p] for k, p in enumerate(inst.candidate_ids) if k != inst.target}
        assert chosen == expected
        sims = inst.metadata["similarities"]
        assert sims[inst.target] == pytest.approx(1.0, abs=1e-5)
        assert inst.metadata["caption_similarities"][inst.target] == pytest.approx(1.0, abs=1e-5)
    manifest = bench.manifest
    assert manifest.clip.random_weights and manifest.filters.category == "equal_or_superset"
    assert not manifest.filters.category_filter_skipped

    # rebuilding with another N and seed reuses both cached embeddings; same seed, same bytes
    again = _adversarial(
        shapes_root, tmp_path / "b", tiny_clip_config, cache, n=3, count=10, seed=4
    )
    assert sorted(again.cache_hits) == ["images", "texts"] and again.cache_misses == []
    _adversarial(
        shapes_root,
        tmp_path / "c",
        tiny_clip_config,
        cache,
        n=4,
        count=20,
        seed=3,
        drop_category_supersets=True,
    )
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "c")


def test_too_few_hard_negatives_fails_without_output(shapes_root, tmp_path, tiny_clip_config):
    with pytest.raises(BenchmarkError, match=r"anchor image \d+ \(images/\d+\.png\): only"):
        _adversarial(
            shapes_root,
            tmp_path / "out",
            tiny_clip_config,
            None,
            use_cache=False,
            n=4,
            count=5,
            pool_size=6,
            caption_threshold=-0.99,
        )
    assert not (tmp_path / "out").exists()


def test_option_errors(shapes_root, tmp_path):
    for options, message in [
        ({"n": 27}, "n: Input should be less than or equal to 26"),
        ({"n": 1}, "n: Input should be greater than or equal to 2"),
        ({"count": 61}, "larger than the pool of 60"),
        ({"pool_size": 100}, "larger than the 60 usable images"),
        ({"setting": "hard"}, "setting: Input should be 'random' or 'adversarial'"),
    ]:
        with pytest.raises(BenchmarkError, match=message):
            build("coco", shapes_root, tmp_path / "out", **{"setting": "random", **options})
    assert not (tmp_path / "out").exists()


def test_loading_reports_every_problem_with_its_line(shapes_root, tmp_path):
    out = tmp_path / "bench"
    build("coco", shapes_root, out, setting="random", n=3, count=6, seed=0)
    lines = (out / BENCHMARK_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    records[1]["target"] = 7
    records[2]["images"][0] = "images/missing.png"
    records[3]["id"] = records[0]["id"]
    records[4]["images"], records[4]["target"] = records[4]["images"][:2], 0
    del records[5]["query"]
    text = "\n".join(json.dumps(r) for r in records) + "\n{not json\n"
    (out / BENCHMARK_FILE).write_text(text)
    with pytest.raises(BenchmarkError) as info:
        load_benchmark(out)
    message = str(info.value)
    for expected in (
        "sha256 mismatch",
        "line 2: target 7 is out of range for 3 images",
        "line 3: image 'images/missing.png' not found under",
        "line 4: duplicate id 'random-00000' (first on line 1)",
        "line 5: 2 images, but the manifest says N=3",
        "line 6: query: Field required",
        "line 7: ",
    ):
        assert expected in message, expected
    # moved data: the manifest's root is overridden
    build("coco", shapes_root, out, setting="random", n=3, count=6, seed=0)
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_benchmark(out, root=tmp_path / "elsewhere")
    assert len(load_benchmark(out / BENCHMARK_FILE)) == 6
    with pytest.raises(BenchmarkError, match=r"has no manifest\.json"):
        load_benchmark(tmp_path)


def test_cli_end_to_end_on_shapes(tmp_path, tiny_clip_config, capsys):
    root = tmp_path / "shapes"
    common = [
        "build",
        "--source",
        "shapes",
        "--root",
        str(root),
        "-N",
        "4",
        "--count",
        "25",
        "--seed",
        "1",
    ]
    assert main([*common, "--setting", "random", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "built 25 random instances, N=4" in out and "shapes dataset generated" in out
    assert len(list((root / "images").iterdir())) == 50  # 2 x count by default
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        code = main(
            [
                *common,
                "--setting",
                "adversarial",
                "--clip-model",
                str(tiny_clip_config),
                "--clip-pretrained",
                "none",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--out",
                str(tmp_path / "a"),
            ]
        )
    assert code == 0
    captured = capsys.readouterr()
    assert "RANDOM weights" in captured.err
    assert "shapes dataset reused" in captured.out and "category equal" in captured.out
    assert len(load_benchmark(tmp_path / "a")) == 25

    space = tmp_path / "space.json"
    space.write_text(json.dumps({"shapes": ["ring", "hexagon"], "max_objects": 1}))
    small = ["build", "--source", "shapes", "--root", str(tmp_path / "rings"), "--count", "8"]
    assert (
        main(
            [
                *small,
                "--setting",
                "random",
                "--shapes-space",
                str(space),
                "--out",
                str(tmp_path / "rings-out"),
            ]
        )
        == 0
    )
    queries = [inst.stem for inst in load_benchmark(tmp_path / "rings-out").instances]
    assert all(("ring" in q) != ("hexagon" in q) for q in queries)
    space.write_text(json.dumps({"shapes": ["blob"]}))
    assert (
        main(
            [
                *small,
                "--setting",
                "random",
                "--shapes-space",
                str(space),
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    assert "unknown shape kinds" in capsys.readouterr().err

    code = main([*common, "--setting", "random", "-N", "30", "--out", str(tmp_path / "bad")])
    assert code == 2 and "n: Input should be less than or equal to 26" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    code = main(
        [
            "build",
            "--source",
            "coco",
            "--root",
            str(tmp_path / "nowhere"),
            "--setting",
            "random",
            "--out",
            str(tmp_path / "bad"),
        ]
    )
    assert code == 2 and "is not a folder" in capsys.readouterr().err


def test_flickr8k_adversarial_skips_the_category_filter_and_says_so(
    shapes_root, tmp_path, tiny_clip_config
):
    # a Flickr8k-layout copy of the shapes images (CSV captions.txt, no categories)
    images = tmp_path / "Images"
    images.mkdir()
    rows = ["image,caption"]
    for image in read_source("shapes", shapes_root).images[:30]:
        name = image.path.split("/")[1].replace(".png", ".jpg")
        (images / name).write_bytes((shapes_root / image.path).read_bytes())
        rows += [f"{name},{caption}" for caption in image.captions]
    (tmp_path / "captions.txt").write_text("\n".join(rows) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = build(
            "flickr8k",
            images,
            tmp_path / "out",
            setting="adversarial",
            n=4,
            count=10,
            clip_model=str(tiny_clip_config),
            clip_pretrained="none",
            use_cache=False,
            device="cpu",
        )
    filters = load_benchmark(tmp_path / "out").manifest.filters
    assert filters.category == "skipped" and filters.category_filter_skipped
    assert "Flickr8k has no object categories" in filters.category_skip_reason
    assert any("category filter skipped" in warning for warning in report.warnings)


def test_output_does_not_depend_on_the_hash_seed(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import posdebias

    src = str(Path(posdebias.__file__).resolve().parents[1])
    outputs = []
    for hash_seed in ("1", "2"):
        folder = tmp_path / f"h{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": src}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "posdebias",
                "build",
                "--source",
                "shapes",
                "--root",
                str(folder / "shapes"),
                "--setting",
                "random",
                "-N",
                "4",
                "--count",
                "30",
                "--out",
                str(folder / "out"),
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        outputs.append(
            (
                _bytes(folder / "out")[0],
                (folder / "shapes/annotations/captions_shapes.json").read_bytes(),
                (folder / "shapes/images/000017.png").read_bytes(),
            )
        )
    assert outputs[0] == outputs[1]
