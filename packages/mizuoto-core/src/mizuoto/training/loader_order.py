"""The order in which torch's shuffling ``DataLoader`` hands out a data set, and the random
draws it makes for it, without a ``DataLoader``: a trainer that must match an upstream recipe
trained through one draws the same numbers in the same order.

- `shuffled(size, generator)`: one pass of a loader without its own generator (its base seed,
  then its ``RandomSampler``'s seed, both from ``generator``, which stands for torch's global
  one);
- `EpochSampler`: such passes batched with ``drop_last=True``, resumable mid-pass;
- `DistributedEpochSampler`: the same loader under torchrun (a ``DistributedSampler``);
- `SampleBatches`: a loader given its own generator (``DataLoader(shuffle=True,
  generator=...)``), batches of ``batch_size`` with the last one short.
"""

from __future__ import annotations

import math

import torch


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One ``torch.empty((), int64).random_()`` draw, as the DataLoader and its sampler make."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def shuffled(size: int, generator: torch.Generator) -> list[int]:
    """One pass of a shuffling ``DataLoader``: it draws its base seed, then its
    ``RandomSampler``'s seed, whose own generator gives ``randperm(size)``."""
    draw_seed(generator)  # the loader's base seed (workers' seeds; unused here)
    permutation = torch.Generator().manual_seed(draw_seed(generator))
    return torch.randperm(size, generator=permutation).tolist()


class EpochSampler:
    """A shuffling ``DataLoader`` (``drop_last=True``) over ``size`` samples.

    Each pass draws the loader's base seed, then (at its first batch) the ``RandomSampler``'s
    seed, whose own generator gives ``randperm(size)``. ``state``/``restore`` let a resumed run
    continue mid-epoch with the same order.
    """

    def __init__(self, size: int, batch_size: int, generator: torch.Generator) -> None:
        if size < batch_size:
            raise ValueError(f"{size} usable samples, fewer than one batch of {batch_size}")
        self.size = size
        self.batch_size = batch_size
        self.generator = generator
        self.order: list[int] = []
        self.position = 0
        self.epoch = -1

    def _new_epoch(self) -> None:
        self.order = shuffled(self.size, self.generator)
        self.position = 0
        self.epoch += 1

    def next_batch(self) -> list[int]:
        if self.epoch < 0 or self.position + self.batch_size > len(self.order):
            self._new_epoch()
        batch = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state(self) -> dict:
        return {"order": self.order, "position": self.position, "epoch": self.epoch}

    def restore(self, state: dict) -> None:
        self.order = list(state["order"])
        self.position = int(state["position"])
        self.epoch = int(state["epoch"])


class DistributedEpochSampler(EpochSampler):
    """The loader under ``torchrun``: a ``DistributedSampler`` (seed 0 + epoch, padded to a
    multiple of the world size, every ``world``-th index from ``rank``) batched with
    ``drop_last``. Each pass still draws the loader's base seed from the generator."""

    def __init__(self, size: int, batch_size: int, generator: torch.Generator, *, rank: int,
                 world: int) -> None:
        per_rank = -(-size // world)
        if per_rank < batch_size:
            raise ValueError(f"{per_rank} samples per process, fewer than one batch of "
                             f"{batch_size}")
        super().__init__(per_rank, batch_size, generator)
        self.size = size
        self.rank, self.world = rank, world

    def _new_epoch(self) -> None:
        draw_seed(self.generator)  # the loader's base seed
        self.epoch += 1
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch))
        order = order.tolist()
        total = -(-self.size // self.world) * self.world
        padding = total - len(order)
        if padding <= len(order):
            order += order[:padding]
        else:
            order += (order * math.ceil(padding / len(order)))[:padding]
        self.order = order[self.rank:total:self.world]
        self.position = 0


def epoch_sampler(size: int, batch_size: int, generator: torch.Generator, world) -> EpochSampler:
    """The loader's order for this process of ``world`` (a `ProcessWorld`): an `EpochSampler`,
    or under ``torchrun`` a `DistributedEpochSampler`."""
    if world.size > 1:
        return DistributedEpochSampler(size, batch_size, generator, rank=world.rank,
                                       world=world.size)
    return EpochSampler(size, batch_size, generator)


class SampleBatches:
    """Shuffled fixed-size batches drawing from one generator across epochs (a
    ``DataLoader(shuffle=True, generator=...)``)."""

    def __init__(self, count: int, batch_size: int, seed: int) -> None:
        self.count = count
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return -(-self.count // self.batch_size)

    def draw_worker_seed(self) -> None:
        # the data loader draws its workers' base seed from its generator on each new iterator
        draw_seed(self.generator)

    def epoch(self) -> list[list[int]]:
        order = torch.randperm(self.count, generator=self.generator).tolist()
        # torch's RandomSampler quirk: after the last index it evaluates
        # randperm(n)[:num_samples % n], an empty tail that still advances the generator
        torch.randperm(self.count, generator=self.generator)
        return [order[i:i + self.batch_size] for i in range(0, self.count, self.batch_size)]
