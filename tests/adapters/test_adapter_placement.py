"""Data x model parallel placement: each data-parallel rank spreads over its own GPU group.

No GPU exists here: the GPU counts and free memory are given to :func:`placement`, and the
loading path that receives its options runs for real on the CPU (``device_map`` with
``max_memory``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from posdebias import load_adapter
from posdebias.errors import InputError
from posdebias.evaluation.distributed import Shard, gpu_group, placement
from posdebias.testing import save_tiny_model


def shard(local_rank: int, world: int = 4) -> Shard:
    state = SimpleNamespace(local_process_index=local_rank, device=f"cuda:{local_rank}")
    return Shard(rank=local_rank, world=world, _state=state)


FREE = {index: (index + 1) * 10**9 for index in range(8)}


@pytest.mark.parametrize(("rank", "group"), [(0, [0, 1]), (1, [2, 3]), (3, [6, 7])])
def test_each_rank_gets_its_own_gpus(rank, group):
    placed = placement({"dtype": "bfloat16"}, shard(rank), 2, visible_gpus=8, free_bytes=FREE)
    assert placed["device_map"] == "auto"
    assert placed["max_memory"] == {index: FREE[index] for index in group}
    assert placed["dtype"] == "bfloat16" and "device" not in placed


def test_groups_of_all_ranks_are_disjoint_and_cover_the_node():
    groups = [gpu_group(rank, 3, 12) for rank in range(4)]
    assert sorted(gpu for group in groups for gpu in group) == list(range(12))


def test_without_gpus_per_process_a_rank_keeps_its_one_device():
    assert placement({}, shard(1), None) == {"device": "cuda:1"}
    assert placement({"device_map": "auto"}, shard(1), None) == {"device_map": "auto"}
    assert placement({}, Shard(), None) == {}


def test_too_few_gpus_and_conflicting_options_are_clear_errors():
    with pytest.raises(InputError, match="needs GPUs 6..7 for local rank 3, but this node shows 7"):
        placement({}, shard(3), 2, visible_gpus=7, free_bytes=FREE)
    with pytest.raises(InputError, match="drop the adapter option device"):
        placement({"device": "cuda:0"}, shard(0), 2, visible_gpus=8, free_bytes=FREE)
    with pytest.raises(InputError, match="needs device_map one of auto"):
        placement({"device_map": {"": 0}}, shard(0), 2, visible_gpus=8, free_bytes=FREE)
    with pytest.raises(InputError, match="at least 1"):
        gpu_group(0, 0, 8)


def test_max_memory_reaches_accelerate(tmp_path, make_instances):
    folder = save_tiny_model("qwen2_vl", tmp_path / "model")
    whole = load_adapter(folder, dtype="float32", device="cpu")
    limited = load_adapter(folder, dtype="float32", device_map="auto", max_memory={"cpu": 10**9})
    assert {p.device.type for p in limited.model.parameters()} == {"cpu"}
    instances = make_instances(2, 3)
    for a, b in zip(whole.observe_many(instances), limited.observe_many(instances), strict=True):
        assert np.max(np.abs(a.label_logprobs - b.label_logprobs)) < 1e-6
    with pytest.raises(InputError, match="set device_map too"):
        load_adapter(folder, max_memory={"cpu": 10**9})


def test_evaluate_with_more_gpus_per_process_than_the_node_has_stops_before_loading(
    tmp_path, capsys
):
    import torch

    from posdebias.cli import main

    wanted = torch.cuda.device_count() + 1
    out = tmp_path / "run"
    code = main(["evaluate", "--model", str(tmp_path), "--gpus-per-process", str(wanted),
                 "--out", str(out)])  # fmt: skip
    assert code == 2
    assert f"gpus_per_process {wanted} needs GPUs 0..{wanted - 1}" in capsys.readouterr().err
    assert not out.exists()
