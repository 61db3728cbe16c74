"""Data-parallel evaluation with Hugging Face accelerate (one model replica per process).

``accelerate launch --multi_gpu --num_processes K -m posdebias evaluate ...`` starts one
process per device (without CUDA the same command runs K CPU processes over gloo); each evaluates
the test instances whose index modulo the world size is its rank, writes its own logs, and
rank 0 merges them into the same report a single process would write.

Data x model parallel: with ``gpus_per_process: G`` each process (local rank r on its node)
spreads its replica over its own G GPUs, r*G .. r*G+G-1 (accelerate's ``device_map`` limited by
``max_memory`` to those GPUs), so K processes x G GPUs use K*G GPUs without two replicas
sharing one. Without it a ``device_map: auto`` replica would spread over EVERY visible GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from posdebias.errors import InputError


@dataclass
class Shard:
    """This process's place in a data-parallel run (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world: int = 1
    _state: Any = None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> str | None:
        return None if self._state is None else str(self._state.device)

    @property
    def local_rank(self) -> int:
        """This process's index on its own node (GPU groups are per node)."""
        return 0 if self._state is None else int(self._state.local_process_index)

    def owns(self, index: int) -> bool:
        return index % self.world == self.rank

    def wait(self) -> None:
        """Barrier: every rank reaches this point before any goes on."""
        if self._state is not None:
            self._state.wait_for_everyone()


def current_shard() -> Shard:
    """The shard of this process, from the environment accelerate/torchrun set."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Shard()
    import torch
    from accelerate import PartialState

    # without CUDA (tests, CPU clusters) the processes talk over gloo
    state = PartialState(cpu=not torch.cuda.is_available())
    return Shard(rank=state.process_index, world=state.num_processes, _state=state)


def gpu_group(local_rank: int, gpus_per_process: int, visible: int) -> list[int]:
    """The GPU indices of one process: ``gpus_per_process`` consecutive GPUs from
    ``local_rank * gpus_per_process``; an error when the node has too few."""
    if gpus_per_process < 1:
        raise InputError(f"gpus_per_process must be at least 1, got {gpus_per_process}")
    first = local_rank * gpus_per_process
    if first + gpus_per_process > visible:
        raise InputError(
            f"gpus_per_process {gpus_per_process} needs GPUs {first}.."
            f"{first + gpus_per_process - 1} for local rank {local_rank}, but this node shows "
            f"{visible}; launch at most "
            f"{max(visible // gpus_per_process, 0)} processes per node (accelerate launch "
            "--num_processes) or lower gpus_per_process"
        )
    return list(range(first, first + gpus_per_process))


def placement(
    options: dict[str, Any],
    shard: Shard,
    gpus_per_process: int | None,
    *,
    visible_gpus: int | None = None,
    free_bytes: dict[int, int] | None = None,
) -> dict[str, Any]:
    """Hugging Face loading options for this process: its own device (data parallel), or with
    ``gpus_per_process`` a ``device_map`` over its own GPU group (data x model parallel).

    ``visible_gpus`` / ``free_bytes`` default to what CUDA reports (tests pass them).
    """
    placed = dict(options)
    if gpus_per_process is None:
        if shard.distributed and not {"device", "device_map"} & set(placed):
            placed["device"] = shard.device
        return placed
    if "device" in placed:
        raise InputError(
            "gpus_per_process places the model on this process's GPU group; drop the adapter "
            f"option device ({placed['device']!r})"
        )
    device_map = placed.get("device_map", "auto")
    if not isinstance(device_map, str) or device_map not in SPREADING_MAPS:
        raise InputError(
            f"gpus_per_process needs device_map one of {', '.join(SPREADING_MAPS)} (it limits "
            f"where accelerate may place layers), not {device_map!r}"
        )
    if visible_gpus is None or free_bytes is None:
        import torch

        visible_gpus = torch.cuda.device_count() if visible_gpus is None else visible_gpus
        if free_bytes is None:
            free_bytes = {i: int(torch.cuda.mem_get_info(i)[0]) for i in range(visible_gpus)}
    group = gpu_group(shard.local_rank, gpus_per_process, visible_gpus)
    placed["device_map"] = device_map
    # accelerate places layers only on the devices max_memory names: this rank's GPUs
    placed["max_memory"] = {index: int(free_bytes[index]) for index in group}
    return placed


#: device_map strategies that spread one model over the devices max_memory allows.
SPREADING_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
