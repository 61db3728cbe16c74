"""Fixtures of the harness tests (helpers in harness_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_helpers import build_organism_benchmark, require_lm_eval, require_lmms_eval


@pytest.fixture
def lmms_eval_installed() -> None:
    require_lmms_eval()


@pytest.fixture
def lm_eval_installed() -> None:
    require_lm_eval()


@pytest.fixture(scope="session")
def organism_benchmark(tmp_path_factory) -> Path:
    """45 items: 5 held out for calibration (seed 0, as `posdebias evaluate` holds them out)
    and the 40 test items of the Done-means comparison."""
    return build_organism_benchmark(tmp_path_factory.mktemp("organism-bench"), count=45)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist names the group into the node ids
def pytest_collection_modifyitems(items):
    """One xdist worker runs every harness test (`make test` uses --dist loadgroup), so the
    benchmark and the lmms-eval runs that several tests read are made once, not per worker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.xdist_group("harness"))
