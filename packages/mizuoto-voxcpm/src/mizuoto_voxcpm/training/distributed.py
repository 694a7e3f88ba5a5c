"""Multi-process training under ``torchrun``: DistributedDataParallel over gloo on the CPU
(upstream's accelerator hard-codes NCCL, so it cannot run multi-process on the CPU) and NCCL on
CUDA, as upstream: every process seeds 42, reads its share of each epoch
(``DistributedSampler``), skips the gradient all-reduce on all but the last micro-batch and
averages gradients on the last; process 0 writes metrics, checkpoints and exports. The world
and the process group are `mizuoto.training.world`'s; this module wraps the training forward.
"""

from __future__ import annotations

import torch
from torch import nn


class TrainingForward(nn.Module):
    """The training forward as a module call, so that DistributedDataParallel can wrap it."""

    def __init__(self, model: nn.Module, losses) -> None:
        super().__init__()
        self.model = model
        self._losses = losses

    def forward(self, batch, progress: float):
        return self._losses(self.model, batch, progress)


def wrap(forward: TrainingForward, device: torch.device, size: int):
    """``(module to call, no_sync context factory or None)``."""
    if size <= 1:
        return forward, None
    ids = [device.index] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(forward, device_ids=ids)
    return ddp, ddp.no_sync
