"""Learning-rate schedules by name: a warm-up shape and a decay, each defined once here.

`build_schedule(name, optimizer, warmup=, total=)` returns a torch ``LRScheduler`` stepped
once per optimiser update (`TrainingRunner` does); ``total``: the updates the schedule spans,
``warmup`` of them rising. ``params.lr_schedule`` picks one by name (`TrainerParams`; each
trainer defaults to its upstream's). Adding a shape is one function here, registered with
``@schedule("name")``: the setting's check and its docs read `SCHEDULES`.

- ``linear`` — f5-tts's: ``SequentialLR`` of two ``LinearLR``, the factor 1e-8 -> 1 over the
  warm-up, then 1 -> 1e-8 over the rest.
- ``cosine`` — ``transformers.get_cosine_schedule_with_warmup`` (upstream VoxCPM's): 0 -> 1
  linearly over the warm-up, then half a cosine down to 0; past ``total`` it rises again along
  the cosine, as upstream's does.
- ``constant`` — 0 -> 1 linearly over the warm-up, then 1 (``get_constant_schedule_with_warmup``).
- ``inverse_sqrt`` — 0 -> 1 linearly over the warm-up, then ``sqrt(warmup / update)``
  (``transformers.get_inverse_sqrt_schedule`` with its timescale at the warm-up; the
  "Attention is all you need" decay); ``total`` does not bound it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mizuoto.errors import InvalidRequest

SCHEDULES: dict[str, Callable] = {}


def schedule(name: str):
    """Register a schedule builder ``(optimizer, warmup, total) -> LRScheduler`` as ``name``."""
    def register(build: Callable) -> Callable:
        SCHEDULES[name] = build
        return build
    return register


def check_schedule(name: str, field: str = "params.lr_schedule") -> str:
    if name not in SCHEDULES:
        raise InvalidRequest(field, f"unknown learning-rate schedule {name!r}",
                             f"one of {', '.join(SCHEDULES)}")
    return name


def check_warmup(name: str, warmup: int, total: int, field: str = "params.warmup_updates"
                 ) -> None:
    """Refuse, before any work, a warm-up schedule ``name`` cannot run over ``total`` updates:
    ``linear``'s decay then has no iterations (its ``LinearLR`` divides by zero at the last
    update, as upstream f5-tts's does)."""
    if name == "linear" and warmup == total:
        raise InvalidRequest(field, f"must not equal the run's {total} updates under the "
                             "linear schedule (its decay would have none)",
                             f"set {field.removeprefix('params.')} below {total}")


def build_schedule(name: str, optimizer, *, warmup: int, total: int):
    """Schedule ``name`` over ``optimizer``: ``warmup`` updates of warm-up, ``total`` in all."""
    return SCHEDULES[check_schedule(name)](optimizer, warmup, total)


class WarmupFactor:
    """A ``LambdaLR`` factor of the update: a subclass's ``__call__``. An object rather than a
    closure: ``LambdaLR`` saves an object's attributes in its state, so a checkpoint carries
    the warm-up and the length, and a resumed run keeps them."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        raise NotImplementedError


class CosineWithWarmup(WarmupFactor):
    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return float(step) / float(max(1, self.warmup))
        progress = float(step - self.warmup) / float(max(1, self.total - self.warmup))
        return max(0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


class ConstantWithWarmup(WarmupFactor):
    def __call__(self, step: int) -> float:
        return float(step) / float(max(1, self.warmup)) if step < self.warmup else 1.0


class InverseSqrtWithWarmup(WarmupFactor):
    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return float(step) / float(max(1, self.warmup))
        return 1.0 / math.sqrt(step / max(1, self.warmup)) if step else 1.0


def _lambda(optimizer, factor: WarmupFactor):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@schedule("linear")
def linear(optimizer, warmup: int, total: int):
    from torch.optim.lr_scheduler import LinearLR, SequentialLR

    return SequentialLR(optimizer, schedulers=[
        LinearLR(optimizer, start_factor=1e-8, end_factor=1.0, total_iters=warmup),
        LinearLR(optimizer, start_factor=1.0, end_factor=1e-8, total_iters=total - warmup),
    ], milestones=[warmup])


@schedule("cosine")
def cosine(optimizer, warmup: int, total: int):
    return _lambda(optimizer, CosineWithWarmup(warmup, total))


@schedule("constant")
def constant(optimizer, warmup: int, total: int):
    return _lambda(optimizer, ConstantWithWarmup(warmup, total))


@schedule("inverse_sqrt")
def inverse_sqrt(optimizer, warmup: int, total: int):
    return _lambda(optimizer, InverseSqrtWithWarmup(warmup, total))
