"""``training.memory`` levels, the parts every trainer shares: activation checkpointing
(`checkpoint_activations`: the trainer names its blocks) and AdamW's state in host memory
between updates (`OptimizerStateOffload`). Both keep every value's bytes. `TrainingRunner`
applies them for ``low`` and ``lowest``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_activations(blocks: Iterable[nn.Module],
                           generator: torch.Generator | None = None) -> int:
    """Recompute each of ``blocks`` in the backward pass instead of keeping its activations
    (``torch.utils.checkpoint``, non-reentrant); returns how many. Random draws replay: torch's
    global generators by checkpoint's own saving, or ``generator`` (a run's private one, e.g.
    for dropout masks), rewound for the recomputation and put back after, so the rest of the
    run sees it as if nothing had been recomputed."""
    count = 0
    for block in blocks:
        block.forward = _recomputed(block.forward, generator)
        count += 1
    return count


def _recomputed(forward, generator: torch.Generator | None):
    def call(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if generator is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        start = generator.get_state()
        runs = 0

        def run(*inner_args, **inner_kwargs):
            nonlocal runs
            runs += 1
            if runs == 1:
                return forward(*inner_args, **inner_kwargs)
            now = generator.get_state()
            generator.set_state(start)
            try:
                return forward(*inner_args, **inner_kwargs)
            finally:
                generator.set_state(now)

        return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
    return call


class OptimizerStateOffload:
    """The optimiser's state (AdamW's moments) in host memory between updates, on the device
    only for the step (``training.memory = "lowest"`` on a GPU): the step's kernel and bytes
    are unchanged. A no-op when the model is on the CPU."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self.active = device.type != "cpu"

    def _move(self, device: torch.device | str) -> None:
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device)

    def to_device(self) -> None:
        if self.active:
            self._move(self.device)

    def to_host(self) -> None:
        if self.active:
            self._move("cpu")
