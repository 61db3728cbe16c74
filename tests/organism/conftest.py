"""One bundled-benchmark cache per session and organism; no test of the organisms may reach
the network."""

from __future__ import annotations

import pytest


def _offline(cache, monkeypatch):
    """POSDEBIAS_CACHE_DIR points at ``cache``; the hub is off."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(scope="session")
def organism_cache(tmp_path_factory):
    from posdebias.organism.benchmark import bundled_benchmark

    cache = tmp_path_factory.mktemp("posdebias-cache")
    bundled_benchmark(4, cache)
    return cache


@pytest.fixture(scope="session")
def text_organism_cache(tmp_path_factory):
    from posdebias.organism.text.benchmark import bundled_text_benchmark

    cache = tmp_path_factory.mktemp("posdebias-text-cache")
    bundled_text_benchmark(4, cache)
    return cache


@pytest.fixture
def cache_dir(organism_cache, monkeypatch):
    """The image organism's session cache, offline."""
    return _offline(organism_cache, monkeypatch)


@pytest.fixture
def text_cache_dir(text_organism_cache, monkeypatch):
    """The text organism's session cache, offline."""
    return _offline(text_organism_cache, monkeypatch)
