"""Shared fixtures and hypothesis profile."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _fresh_registry():
    """Each test sees a registry built from scratch (plugins registered in one test stay there)."""
    from posdebias.registry import reset_registry

    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder on sys.path for plugin distributions written by a test."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site
