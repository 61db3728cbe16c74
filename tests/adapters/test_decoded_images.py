"""An adapter decodes each image file once while it is shown in its orders and rotations, and
never answers from an image the file no longer holds."""

from __future__ import annotations

import os
import shutil

import numpy as np

import posdebias.adapters.hf.adapter as hf_adapter
from posdebias.core.instance import Instance
from posdebias.loading import get_adapter
from posdebias.testing import tiny_model_and_processor, write_test_images


def fresh_adapter():
    return get_adapter(*tiny_model_and_processor("llava"))


def scores(adapter, instance: Instance) -> np.ndarray:
    return np.asarray(adapter.observe(instance).label_logprobs)


def test_a_rewritten_image_file_is_decoded_again(tmp_path):
    images = [str(p) for p in write_test_images(tmp_path / "shown", 3, seed=0)]
    other = write_test_images(tmp_path / "other", 1, seed=1)[0]
    instance = Instance("a red square", tuple(images), 0, "i")
    adapter = fresh_adapter()
    first = scores(adapter, instance)
    assert np.array_equal(scores(adapter, instance.permuted([1, 2, 0])),
                          scores(fresh_adapter(), instance.permuted([1, 2, 0])))  # fmt: skip
    assert np.array_equal(scores(adapter, instance), first)
    shutil.copy(other, images[0])  # same path, other pixels
    os.utime(images[0], ns=(1, 1))
    rewritten = scores(adapter, instance)
    assert np.array_equal(rewritten, scores(fresh_adapter(), instance))
    assert not np.array_equal(rewritten, first)  # the image mattered
    # rewritten back as `cp -p` or `rsync -t` do: the old bytes and the same mtime
    again = write_test_images(tmp_path / "again", 1, seed=0)[0]  # the first image's pixels
    shutil.copyfile(again, images[0])
    os.utime(images[0], ns=(1, 1))
    assert np.array_equal(scores(adapter, instance), first)


def test_the_adapter_keeps_a_bounded_number_of_images(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_adapter, "DECODED_IMAGES", 4)
    images = [str(p) for p in write_test_images(tmp_path, 6)]
    instances = [Instance("a red square", tuple(images[k : k + 3]), 0, f"i{k}") for k in (0, 3)]
    adapter, reference = fresh_adapter(), fresh_adapter()
    for _ in range(2):
        for instance in (*instances, instances[0].permuted([2, 0, 1])):
            assert np.array_equal(scores(adapter, instance), scores(reference, instance))
    assert len(adapter._decoded) == 4
