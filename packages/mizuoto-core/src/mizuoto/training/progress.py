"""Progress of a training run: each update reports ``train done/total`` with the loss, the
rate and the time left (``loss 0.4213 · 1.84 s/step · ETA 0:12:31``). The rate counts only the
updates this process made (a resumed run's earlier ones took no time here)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from mizuoto.contracts.progress import ProgressCallback, report


def clock_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def rate_text(seconds_per_step: float) -> str:
    if seconds_per_step >= 1 or seconds_per_step == 0:
        return f"{seconds_per_step:.2f} s/step"
    return f"{1 / seconds_per_step:.2f} steps/s"


class StepProgress:
    """Reports updates to ``callback`` (None: nothing). ``losses``: the keys of the values
    shown, in order (``loss`` by default)."""

    def __init__(self, callback: ProgressCallback | None, total: int, start: int = 0, *,
                 stage: str = "train", losses: tuple[str, ...] = ("loss",),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.callback = callback
        self.total = total
        self.start = start
        self.stage = stage
        self.losses = losses
        self.clock = clock
        self.began = clock()

    def detail(self, done: int, values: Mapping[str, float]) -> str:
        parts = [f"{key} {values[key]:.4f}" for key in self.losses if key in values]
        made = done - self.start
        if made > 0:
            per_step = (self.clock() - self.began) / made
            parts.append(rate_text(per_step))
            parts.append(f"ETA {clock_text(per_step * max(self.total - done, 0))}")
        return " · ".join(parts)

    def __call__(self, done: int, values: Mapping[str, float]) -> None:
        if self.callback is not None:
            report(self.callback, self.stage, done, self.total, self.detail(done, values))
