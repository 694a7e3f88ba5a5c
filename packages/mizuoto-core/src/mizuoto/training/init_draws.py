"""Replaying the random draws PyTorch's default initialisations make while a model is built.

An upstream recipe that builds its model with the default initialisations (Kaiming-uniform
linear and convolution weights, uniform biases, normal embeddings) and then loads a
checkpoint over them has lost those values, but its generator has moved on: whatever it draws
next (adapter matrices, the data order, every training draw) comes after. A trainer that
loads the weights without building them makes the same draws, in the same order and with the
same sizes, into a scratch buffer (`replay`), so its generator arrives where upstream's does.

A model's construction is a sequence of `Draw`s; `linear` and `conv` give a layer's. A float32
``uniform_`` consumes one 32-bit number per element whatever its bounds, so runs of uniform
draws are replayed as one count; ``normal_`` is replayed per tensor (its consumption depends
on the size).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

Draw = tuple[str, int]  # ("uniform" | "normal", number of elements)
_CHUNK = 1 << 24


def linear(in_features: int, out_features: int, bias: bool = True) -> Iterator[Draw]:
    """``nn.Linear``'s draws: the weight, then the bias."""
    yield "uniform", in_features * out_features
    if bias:
        yield "uniform", out_features


def conv(in_channels: int, out_channels: int, kernel: int, groups: int = 1,
         bias: bool = True) -> Iterator[Draw]:
    """A 1-D convolution's draws (a transposed one's weight is ``(in, out, kernel)``: the
    same count)."""
    yield "uniform", out_channels * (in_channels // groups) * kernel
    if bias:
        yield "uniform", out_channels


def replay(generator: torch.Generator, draws: Iterator[Draw]) -> int:
    """Consume ``draws`` from ``generator``; returns the number of elements drawn."""
    total = 0
    pending = 0
    scratch = torch.empty(0)

    def buffer(size: int) -> torch.Tensor:
        nonlocal scratch
        if scratch.numel() < size:
            scratch = torch.empty(size)
        return scratch[:size]

    def flush() -> None:
        nonlocal pending
        while pending:
            size = min(pending, _CHUNK)
            buffer(size).uniform_(generator=generator)
            pending -= size

    for kind, count in draws:
        total += count
        if kind == "uniform":
            pending += count
            continue
        flush()
        buffer(count).normal_(generator=generator)
    flush()
    return total
