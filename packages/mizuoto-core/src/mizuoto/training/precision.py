"""Where mixed precision enters a training step, as one object: the forward pass runs under
`Precision.autocast`, the loss goes backward through `backward`, and the optimiser steps
through `unscale` + `step` (a gradient scaler's hooks when there is one). The arithmetic is
`mizuoto.runtime.precision`'s (accelerate's semantics); this wraps it for a step loop.

``Precision()`` (mode ``no``) changes nothing: the context is a no-op, the loss is not scaled,
and the optimiser steps as it would without this object, so a trainer written against it keeps
its bytes. ``bf16``/``fp16`` autocast to that dtype on ``device_type``; the scaler is
accelerate's choice (``fp16`` only) unless ``scaler`` says otherwise (upstream VoxCPM scales
its bf16 CUDA steps too).
"""

from __future__ import annotations

from typing import Any

from mizuoto.runtime import precision as amp

MODES = ("no", "bf16", "fp16")


class Precision:
    def __init__(self, mode: str = "no", device_type: str = "cpu", *,
                 scaler: bool | None = None) -> None:
        import torch

        if mode not in MODES:
            raise ValueError(f"mixed precision must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device = torch.device(device_type)
        if scaler is None:
            self.scaler = amp.grad_scaler(self.device, mode)
        else:
            self.scaler = torch.amp.GradScaler(self.device.type) if scaler else None

    def autocast(self):
        return amp.autocast(self.device, self.mode)

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer) -> None:
        """Before clipping: the gradients in their true scale."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        """The optimiser's step (through the scaler); False when the scaler skipped it."""
        return amp.scaled_step(optimizer, self.scaler)

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
