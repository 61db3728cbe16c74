"""Data-parallel evaluation with Hugging Face accelerate (one model replica per process).

``accelerate launch --multi_gpu --num_processes K -m posdebias evaluate ...`` starts one
process per device (without CUDA the same command runs K CPU processes over gloo); each evaluates
the test instances whose index modulo the world size is its rank, writes its own logs, and
rank 0 merges them into the same report a single process would write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


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
