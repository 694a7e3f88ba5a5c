"""A validation pass: the model's losses on held-out rows, without gradients (inside
`evaluating`: eval mode, training mode again after), each loss's mean over the batches and
the weighted total's (``weights``: each loss's factor in the training objective, 1 where not
given).

`is_due(step, interval, total)` says when (every ``interval`` steps and after the last);
`validation_batches` the rows of one pass in a shuffling loader's order (`loader_order`), at
most ``max_batches`` of them, the last one possibly short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from mizuoto.training.loader_order import shuffled


def is_due(step: int, interval: int, total: int) -> bool:
    """Whether a validation follows step ``step`` (0-based) of ``total``."""
    return step % interval == 0 or step == total - 1


def validation_batches(size: int, batch_size: int, generator: torch.Generator, *,
                       max_batches: int) -> list[list[int]]:
    """The rows of one validation pass over ``size`` rows, in a shuffling loader's order."""
    order = shuffled(size, generator)[:max_batches * batch_size]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def validation_losses(batches: Iterable[Any],
                      losses: Callable[[Any], Mapping[str, torch.Tensor]], *,
                      weights: Mapping[str, float] | None = None,
                      autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
                      prefix: str = "val/") -> dict[str, float]:
    """The mean losses of ``losses(batch)`` over ``batches`` (``<prefix>loss/total``: the
    weighted total's, then ``<prefix><key>`` each loss's)."""
    autocast = autocast or contextlib.nullcontext
    outputs = []
    with torch.no_grad():
        for batch in batches:
            with autocast():
                values = losses(batch)
            outputs.append({key: value.detach() for key, value in values.items()})
    return mean_losses(outputs, weights or {}, prefix=prefix)


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off), in training mode again after."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def mean_losses(outputs: Sequence[Mapping[str, torch.Tensor]], weights: Mapping[str, float],
                *, prefix: str = "val/") -> dict[str, float]:
    """The weighted total per batch, then each loss, averaged over the batches."""
    totals = []
    for losses in outputs:
        total = 0.0
        for key, value in losses.items():
            total = total + weights.get(key, 1.0) * value
        totals.append(total)
    means = {f"{prefix}loss/total": torch.stack(totals).mean().item()}
    for key in outputs[0]:
        means[f"{prefix}{key}"] = torch.stack([losses[key] for losses in outputs]).mean().item()
    return means
