"""Every cache writer goes through the one run-directory layer (posdebias._rundir): the CLIP
embedding cache, the copies of CLIP model configs, the bundled text questions and the
harness's shared calibrations never write through a link, never into a folder of someone
else's files, and leave what they refuse as it was."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from posdebias._rundir import CacheFolder
from posdebias.benchmarks.clip import EmbeddingCache
from posdebias.errors import OutputError

IDENTITY = {"model": "m", "pretrained": "p"}
ITEMS = ["a", "b"]


def _compute():
    return np.arange(6, dtype=np.float32).reshape(2, 3)


def _embedding_name(kind: str = "images") -> str:
    return f"{kind}-{EmbeddingCache.key(kind, IDENTITY, ITEMS)[:40]}.safetensors"


@pytest.mark.parametrize("target", ["missing", "user-file"])
def test_the_clip_cache_never_writes_through_a_link(tmp_path, target):
    folder = tmp_path / "cache"
    folder.mkdir()
    victim = tmp_path / target
    if target == "user-file":
        victim.write_text("the user's")
    os.symlink(victim, folder / _embedding_name())
    with pytest.raises(OutputError, match="symbolic links"):
        EmbeddingCache(folder).get_or_compute("images", IDENTITY, ITEMS, _compute)
    assert os.path.islink(folder / _embedding_name())
    assert not victim.exists() if target == "missing" else victim.read_text() == "the user's"


def test_the_clip_cache_refuses_a_folder_of_other_files_and_keeps_its_own(tmp_path):
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(OutputError, match=r"not a posdebias cache of CLIP embeddings.*notes\.txt"):
        EmbeddingCache(foreign).get_or_compute("images", IDENTITY, ITEMS, _compute)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    # a cache of ours (written before, by this or an older posdebias) is read and added to
    ours = tmp_path / "ours"
    cache = EmbeddingCache(ours)
    first = cache.get_or_compute("images", IDENTITY, ITEMS, _compute)
    second = EmbeddingCache(ours).get_or_compute("texts", IDENTITY, ITEMS, lambda: first + 1)
    again = EmbeddingCache(ours)
    assert np.array_equal(again.get_or_compute("images", IDENTITY, ITEMS, _compute), first)
    assert np.array_equal(again.get_or_compute("texts", IDENTITY, ITEMS, _compute), second)
    assert again.hits == ["images", "texts"]
    assert sorted(p.name for p in ours.iterdir()) == sorted(
        [_embedding_name("images"), _embedding_name("texts")]
    )


def test_a_cache_folder_stores_only_its_own_names(tmp_path):
    folder = CacheFolder(tmp_path / "c", own=re.compile(r"x-\d\.bin\Z"), kind="k", flag="f")
    assert folder.cached("x-1.bin") is None
    path = folder.store("x-1.bin", b"data")
    assert folder.cached("x-1.bin") == path and path.read_bytes() == b"data"
    with pytest.raises(ValueError, match="not a file of k"):
        folder.store("../x-1.bin", b"data")
    (tmp_path / "c" / "x-2.bin").mkdir()  # a folder where a file of ours belongs
    with pytest.raises(OutputError, match="not empty and is not a k"):
        folder.store("x-1.bin", b"other")
    assert path.read_bytes() == b"data"


@pytest.mark.parametrize("planted", ["dangling link", "link to a file", "foreign file"])
def test_the_bundled_questions_are_written_through_the_layer(tmp_path, planted):
    from posdebias.organism.text.benchmark import VERSION, bundled_text_benchmark

    questions = tmp_path / "benchmarks" / f"text-organism-v{VERSION}" / "questions"
    questions.mkdir(parents=True)
    victim = tmp_path / "victim.jsonl"
    if planted == "link to a file":
        victim.write_text("the user's\n")
    if planted == "foreign file":
        (questions / "mine.txt").write_text("the user's\n")
    else:
        os.symlink(victim, questions / "questions-n4.jsonl")
    with pytest.raises(OutputError, match="questions") as refused:
        bundled_text_benchmark(4, tmp_path)
    assert "link" in str(refused.value) or "mine.txt" in str(refused.value)
    if planted == "link to a file":
        assert victim.read_text() == "the user's\n"
    elif planted == "dangling link":
        assert not victim.exists() and os.path.islink(questions / "questions-n4.jsonl")
    else:
        assert (questions / "mine.txt").read_text() == "the user's\n"
    assert not (questions.parent / "n4").exists()  # no benchmark was built


@pytest.mark.parametrize("planted", [None, "dangling link"])
def test_a_clip_config_copy_goes_to_the_cache_through_the_layer(
    tmp_path, monkeypatch, tiny_clip_config, planted
):
    # the copies went to a fixed folder of the shared temporary directory, unchecked
    import json

    import open_clip

    from posdebias.benchmarks.clip import _register_config_file, _sha256_json

    config = {**json.loads(tiny_clip_config.read_text()), "embed_dim": 8 + len(str(planted))}
    path = tmp_path / "own-config.json"
    path.write_text(json.dumps(config))
    name = f"posdebias-config-{_sha256_json(config)[:16]}"
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "cache" / "clip-configs" / f"{name}.json"
    if planted is not None:
        copy.parent.mkdir(parents=True)
        os.symlink(tmp_path / "victim.json", copy)
        with pytest.raises(OutputError, match="symbolic links"):
            _register_config_file(path)
        assert os.path.islink(copy) and not (tmp_path / "victim.json").exists()
        assert name not in open_clip.list_models()
        return
    assert _register_config_file(path)[0] == name
    assert name in open_clip.list_models()
    assert json.loads(copy.read_text()) == config


@pytest.mark.parametrize(
    "planted",
    [None, "dangling link", "foreign file", "foreign file in states", "not a state",
     "interrupted", "states a link"],
)  # fmt: skip
def test_the_harness_shares_its_calibration_through_the_layer(tmp_path, monkeypatch, planted):
    # provenance.json was written with a bare atomic write: over a link, into any folder
    import json

    from posdebias.integrations.harness import HarnessConfig, HarnessDebiaser
    from posdebias.organism.text.benchmark import bundled_text_benchmark

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    benchmark = bundled_text_benchmark(4, tmp_path / "bench-cache")
    config = HarnessConfig(
        pretrained="posdebias/text-organism",
        calibrators=["pride"],
        calibration=str(benchmark),
        calibration_count=3,
        cache_dir=str(tmp_path / "harness"),
        label_set="upper",
    )
    first = HarnessDebiaser(config)
    first.calibrate()
    states = Path(first.provenance["states"])
    folder = states.parent
    assert json.loads((folder / "provenance.json").read_text())["source"] == "benchmark"
    assert sorted(p.name for p in states.iterdir()) == ["pride.json"]
    if planted is None:  # the same calibration again: the folder is ours, written over
        again = HarnessDebiaser(config)
        again.calibrate()
        assert again.provenance["states"] == str(states)
        return
    provenance = (folder / "provenance.json").read_text()
    if planted == "interrupted":  # a writer stopped before its provenance: written over
        (folder / "provenance.json").unlink()
        again = HarnessDebiaser(config)
        again.calibrate()
        assert json.loads((folder / "provenance.json").read_text())["source"] == "benchmark"
        return
    if planted in ("foreign file in states", "not a state"):
        name = "notes.txt" if planted == "foreign file in states" else "pride.json"
        (states / name).write_text("the user's")
        with pytest.raises(OutputError, match=r"notes\.txt|not a calibration state"):
            HarnessDebiaser(config).calibrate()
        assert (states / name).read_text() == "the user's"
        assert (folder / "provenance.json").read_text() == provenance  # nothing replaced
        return
    shutil.rmtree(folder)
    folder.mkdir()
    if planted == "dangling link":
        (folder / "provenance.json").symlink_to(tmp_path / "victim.json")
    elif planted == "states a link":
        (tmp_path / "elsewhere").mkdir()
        (folder / "states").symlink_to(tmp_path / "elsewhere")
    else:
        (folder / "notes.txt").write_text("the user's")
    with pytest.raises(OutputError, match="symbolic link|notes.txt"):
        HarnessDebiaser(config).calibrate()
    assert not (tmp_path / "victim.json").exists()
    if planted == "states a link":
        assert (folder / "states").is_symlink() and not any((tmp_path / "elsewhere").iterdir())
    else:
        assert not (folder / "states").exists()
