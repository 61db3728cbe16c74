"""Fixtures of the adapter tests: tiny random-weight models of each family, real PNG files."""

from __future__ import annotations

import contextlib

import pytest

from posdebias.core.instance import Instance
from posdebias.testing import FAMILIES, write_test_images


@pytest.fixture(scope="session")
def image_files(tmp_path_factory):
    return write_test_images(tmp_path_factory.mktemp("images"), 16)


@pytest.fixture(scope="session")
def make_instances(image_files):
    """Instances of N images with captions of different lengths (left padding in batches)."""

    def make(count: int, n: int, offset: int = 0) -> list[Instance]:
        instances = []
        for index in range(count):
            start = (offset + 3 * index) % (len(image_files) - n + 1)
            caption = "a photo of a red square" + " on a blue background" * index
            instances.append(
                Instance(
                    stem=caption,
                    images=tuple(image_files[start : start + n]),
                    target=index % n,
                    id=f"inst-{offset}-{index}",
                )
            )
        return instances

    return make


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@contextlib.contextmanager
def _one_torch_thread():
    """Tiny models run many small ops: one thread is faster, and far faster on a busy machine
    (no spinning thread barriers); restored afterwards for the other tests."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """On one thread also while a fixture is made: the tiny models and saved folders that a
    module's or the session's tests share are built before any test's own fixtures run."""
    with _one_torch_thread():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _one_torch_thread():
        yield
