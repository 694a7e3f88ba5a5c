"""Where mixed precision enters a training step: the forward pass runs under `autocast`, the
loss goes backward through `backward`, and the optimiser steps through `unscale` + `step`
(a gradient scaler's hooks when there is one).

``Precision()`` (mode ``no``) changes nothing: the context is a no-op, the loss is not scaled,
and the optimiser steps as it would without this object, so a trainer written against it keeps
its bytes. ``bf16``/``fp16`` autocast to that dtype on ``device_type``; ``scaler=True`` adds
``torch.amp.GradScaler`` (loss scaling, skipped steps on overflow), as upstream VoxCPM's CUDA
recipe and accelerate's fp16 do.
"""

from __future__ import annotations

import contextlib
from typing import Any

MODES = ("no", "bf16", "fp16")


class Precision:
    def __init__(self, mode: str = "no", device_type: str = "cpu", *, scaler: bool = False
                 ) -> None:
        import torch

        if mode not in MODES:
            raise ValueError(f"mixed precision must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device_type = device_type
        self.dtype = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
        self.scaler = torch.amp.GradScaler(device_type) if scaler else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer) -> None:
        """Before clipping: the gradients in their true scale."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
