"""`EpochPosition`: where a run stands in its data (epoch, next batch of the epoch's order,
updates made) and how many micro-batches its next update takes, as a loop over a data loader
prepared by accelerate counts them: an update every ``grad_accumulation`` batches and at the
epoch's last batch, where accelerate's step counter restarts (``GradientState.
end_of_dataloader``). Under torchrun (``shard``) rank r takes batches r, r + N, ... of every
epoch's order, wrapping around, so that every process makes the same number of updates.

The trainer gives ``new_order(epoch)``: the epoch's batches (lists of item indices), called as
the epoch's first batch is drawn, so that the data loader's random draws fall where upstream's
do. `state_dict`/`load_state_dict` resume mid-epoch with the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from mizuoto.training.world import ProcessWorld


class EpochPosition:
    """See the module doc. ``batches``: an epoch's batches in one process; ``max_updates``: the
    run stops there even mid-epoch (None: after ``epochs``)."""

    def __init__(self, batches: int, *, epochs: int, new_order: Callable[[int], list[list[int]]],
                 grad_accumulation: int = 1, world: ProcessWorld | None = None,
                 shard: bool = True, max_updates: int | None = None) -> None:
        if batches <= 0:
            raise ValueError("an epoch of no batches")
        world = world or ProcessWorld()
        self.rank, self.world_size = world.rank, world.size
        self.shard = shard and world.size > 1
        self.batches_per_epoch = -(-batches // world.size) if self.shard else batches
        self.grad_accumulation = grad_accumulation
        self.epochs = epochs
        self.new_order = new_order
        #: the updates the epochs make (a learning-rate schedule spans them)
        self.schedule_updates = math.ceil(self.batches_per_epoch / grad_accumulation) * epochs
        self.total_updates = min(self.schedule_updates, max_updates or self.schedule_updates)
        self.epoch = self.index = self.update = 0
        self.accumulated = 0  # accelerate's step counter
        self.order: list[list[int]] = []

    def micro_batches(self) -> int:
        """The micro-batches of the next update."""
        every = self.grad_accumulation
        return min(every - self.accumulated % every, self.batches_per_epoch - self.index)

    def next_batch(self) -> list[int]:
        """The item indices of the next micro-batch (a new epoch's order drawn first)."""
        if self.index == 0:
            order = self.new_order(self.epoch)
            if self.shard:
                order = [order[(self.rank + i * self.world_size) % len(order)]
                         for i in range(self.batches_per_epoch)]
            self.order = order
        batch = self.order[self.index]
        last = self.index == len(self.order) - 1
        self.accumulated = 0 if last else self.accumulated + 1
        self.index += 1
        if last:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "update": self.update,
                "accumulated": self.accumulated, "order": self.order}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self.update, self.accumulated = state["update"], state["accumulated"]
        self.order = [list(batch) for batch in state["order"]]
