"""One bundled-benchmark cache per session; no test of the organism may reach the network."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def organism_cache(tmp_path_factory):
    from posdebias.organism.benchmark import bundled_benchmark

    cache = tmp_path_factory.mktemp("posdebias-cache")
    bundled_benchmark(4, cache)
    return cache


@pytest.fixture
def cache_dir(organism_cache, monkeypatch):
    """POSDEBIAS_CACHE_DIR points at the session cache; the hub is off."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(organism_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return organism_cache


@pytest.fixture(scope="session")
def text_organism_cache(tmp_path_factory):
    from posdebias.organism.text.benchmark import bundled_text_benchmark

    cache = tmp_path_factory.mktemp("posdebias-text-cache")
    bundled_text_benchmark(4, cache)
    return cache


@pytest.fixture
def text_cache_dir(text_organism_cache, monkeypatch):
    """POSDEBIAS_CACHE_DIR points at the text organism's session cache; the hub is off."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(text_organism_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return text_organism_cache
