"""order_kind: cyclic, the T orders of rotated harness tasks and CircularEval."""

from __future__ import annotations

import json

import pytest

from posdebias.core.instance import Instance
from posdebias.errors import InputError
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.job import run_evaluation
from posdebias.evaluation.runner import instance_orders


def test_cyclic_orders_are_the_first_rotations():
    instance = Instance(stem="q", images=("a", "b", "c", "d"), target=1, id="x")
    orders = instance_orders(instance, 3, seed=7, cyclic=True)
    assert [order.tolist() for order in orders] == [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1]]
    assert [instance.permuted(o).candidate_ids for o in orders] == [
        instance.rotated(r).candidate_ids for r in range(3)
    ]
    with pytest.raises(InputError, match="5 cyclic orders requested, but 4 candidates"):
        instance_orders(instance, 5, seed=0, cyclic=True)


def test_a_cyclic_run_shows_every_rotation_once(tmp_path):
    config = EvaluateConfig(
        adapter={"name": "synthetic"}, n=4, orders=4, order_kind="cyclic", count=6,
        calibrators=["vanilla"], out=tmp_path / "run",
    )  # fmt: skip
    results = run_evaluation(config)
    assert results.orders == 4 and results.settings.order_kind == "cyclic"
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").open()]
    assert len(records) == 6
    rotations = [[(i + r) % 4 for i in range(4)] for r in range(4)]
    assert all(record["orders"] == rotations for record in records)
    with pytest.raises(InputError, match="only 4 rotations"):
        run_evaluation(config.model_copy(update={"orders": 5, "out": None}))
