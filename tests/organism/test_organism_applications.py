"""The Debiaser on the bundled organism: calibration without labels on real model code."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import posdebias
from posdebias import Debiaser


@pytest.fixture
def one_thread():
    """The organism is tiny: one torch thread is far faster on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_label_free_on_the_organism_matches_labelled_calibration(cache_dir, one_thread):
    from posdebias.benchmarks.files import load_benchmark
    from posdebias.organism import MODEL_NAME
    from posdebias.organism.benchmark import bundled_benchmark

    organism_adapter = posdebias.load_adapter(MODEL_NAME)
    instances = load_benchmark(bundled_benchmark(4)).instances
    calibration, test = instances[:5], instances[5:25]
    labelled = Debiaser(organism_adapter, ["attention_guided", "vanilla"], batch_size=20)
    labelled.calibrate(calibration)
    unlabelled = Debiaser(organism_adapter, "label_free", batch_size=20)
    state = unlabelled.calibrate([replace(i, target=None) for i in calibration])
    assert state.diagnostics["attention_informative"] is True
    assert state.diagnostics["attention_consistency"] > 0.5  # 0.82 measured
    guided = list(labelled.rank_many(test, batch_size=10))
    free = list(unlabelled.rank_many(test, batch_size=10))
    right = {
        "label_free": sum(r.choice == i.target for r, i in zip(free, test, strict=True)),
        "attention_guided": sum(r.choice == i.target for r, i in zip(guided, test, strict=True)),
        "vanilla": sum(
            r.of("vanilla").choice == i.target for r, i in zip(guided, test, strict=True)
        ),
    }
    assert right["label_free"] >= right["attention_guided"] - 1
    assert right["label_free"] > right["vanilla"]
    np.testing.assert_allclose(
        state.bias_matrix, labelled.states["attention_guided"].bias_matrix, atol=0.5
    )


def test_every_public_name_of_the_api_guide_is_documented_there():
    import posdebias.api

    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    used = set(re.findall(r"\b(?:posdebias|ranking|evidence|debiaser|free|state)\.(\w+)", example))
    used -= {"benchmarks", "organism"}  # modules: the names imported from them count
    for names in re.findall(r"from posdebias[.\w]* import (.*)", example):
        used |= set(names.replace(" ", "").split(","))
    reference = text[text.index("## `Debiaser`") :]
    for name in sorted(used):
        assert f"`{name}" in reference or f"{name}(" in reference, name
    for name in ("Debiaser", "Ranking", "Evidence", "Prediction", "CalibrationWarning"):
        assert getattr(posdebias, name).__doc__, name
    assert posdebias.api.Ranking is posdebias.Ranking
