"""Fixtures of the harness tests (helpers in harness_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_helpers import (
    CALIBRATORS,
    build_organism_benchmark,
    require_lm_eval,
    require_lmms_eval,
)

from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.job import run_evaluation
from posdebias.evaluation.results import EvaluationResults


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


@pytest.fixture(scope="session")
def own_evaluate(organism_benchmark) -> EvaluationResults:
    """posdebias's own evaluate on the 40 test items (the same 5 held out by seed 0) in the
    same 4 cyclic orders as the harnesses' rotated tasks: what both harnesses must equal."""
    config = EvaluateConfig(
        model="posdebias/organism",
        benchmark=organism_benchmark,
        count=40,
        calibration_count=5,
        orders=4,
        order_kind="cyclic",
        seed=0,
        calibrators=list(CALIBRATORS),
    )
    return run_evaluation(config)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist names the group into the node ids
def pytest_collection_modifyitems(items):
    """One xdist worker runs every harness test (`make test` uses --dist loadgroup), so the
    benchmark and the lmms-eval runs that several tests read are made once, not per worker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.xdist_group("harness"))
