"""The processes of a training run: one, or several under ``torchrun``.

`process_world()` reads torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``);
without it the run is one process, rank 0. `join(world, device_type)` joins the process group
(NCCL for CUDA, gloo otherwise: gloo is what lets a multi-process run work on the CPU) once;
`barrier()` waits for every process, and is a no-op in a single process. Process 0 (`main`)
writes what the run shares: metrics, checkpoints, exports.
"""

from __future__ import annotations

import os

import attrs


@attrs.frozen
class ProcessWorld:
    size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def process_world() -> ProcessWorld:
    """This process's place from torchrun's environment; ``ProcessWorld()`` without it."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return ProcessWorld()
    return ProcessWorld(size, int(os.environ.get("RANK", "0")),
                        int(os.environ.get("LOCAL_RANK", "0")))


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def join(world: ProcessWorld, device_type: str = "cpu") -> ProcessWorld:
    """Join the process group of a multi-process run (once; a single process joins nothing)."""
    if world.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend_for(device_type), init_method="env://")
    return world


def barrier() -> None:
    """Wait for every process of the group; nothing without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather(value, world: ProcessWorld) -> list:
    """Every process's ``value`` (picklable), by rank; ``[value]`` in a single process."""
    if not world.distributed:
        return [value]
    import torch.distributed as dist

    values = [None] * world.size
    dist.all_gather_object(values, value)
    return values
