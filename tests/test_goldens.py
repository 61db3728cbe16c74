"""The seeded default runs give exactly the pinned metrics (tests/goldens/*.json).

A deliberate change of the numbers regenerates them: ``make goldens``.
"""

from __future__ import annotations

import json

import pytest

from golden import RUNS, path_of, run_metrics
from helpers import flat

#: The real models' runs load a GGUF file each: one worker runs them with the other real tests.
REAL = [pytest.mark.xdist_group("real_models"), pytest.mark.slow]


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=REAL if name.startswith("real_") else []) for name in RUNS],
)
def test_default_run_matches_its_golden_metrics(name, tmp_path, monkeypatch, request):
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = json.loads(path_of(name).read_text())
    files, real = None, None
    if name.startswith("real_"):  # the models the worker has loaded, if the run loads them so
        real = request.getfixturevalue("real_models")
        monkeypatch.setattr("posdebias.evaluation.job.open_adapter", real.open_adapter)
        files, reused = real.files, real.reused
    got = json.loads(json.dumps(run_metrics(RUNS[name], tmp_path, files)))
    if real is not None:  # the fixture loads each model as the run does: one load each
        assert real.reused == reused + 1
    assert got["run"] == expected["run"]
    assert (got["n"], got["orders"], got["num_instances"]) == (
        expected["n"], expected["orders"], expected["num_instances"],
    )  # fmt: skip
    assert flat(got["metrics"]).keys() == flat(expected["metrics"]).keys()
    assert flat(got["metrics"]) == pytest.approx(flat(expected["metrics"]), abs=1e-9), (
        f"{name}: the metrics moved; if that is deliberate, run `make goldens` and commit"
    )
    assert got["statistics"] is not None  # intervals, position views, paired tests
    assert flat(got["statistics"]) == pytest.approx(flat(expected["statistics"]), abs=1e-9), (
        f"{name}: the intervals moved; if that is deliberate, run `make goldens` and commit"
    )
