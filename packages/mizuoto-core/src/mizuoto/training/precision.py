"""Mixed-precision training, ``training.mixed_precision``, as accelerate applies it: the one
module that says how (`TrainingRunner` uses it; ``mizuoto.runtime.precision`` is an old path to
the same names).

- the modes, ``auto`` (the trainer's upstream default), ``no``, ``fp16``, ``bf16``: declared once,
  as ``mizuoto.contracts.trainer.MIXED_PRECISION`` (the setting's choices).
- `autocast(device, mode)`: the forward's context, accelerate's
  ``get_mixed_precision_context_manager``: ``torch.autocast(device.type, float16|bfloat16)``,
  or a null context for ``no``.
- `grad_scaler(device, mode)`: ``torch.amp.GradScaler(device.type)`` with torch's defaults for
  ``fp16`` (accelerate's loss scaling), else None.
- `scaled_step(optimizer, scaler) -> bool`: one optimiser step, through the scaler when there
  is one; False when the scaler skipped it (inf or NaN gradients). Like accelerate's
  ``AcceleratedOptimizer``, the skip is read from whether the optimiser's ``step`` was called:
  a fused optimiser is always called (it skips inside its kernel), and then counts as
  stepped, which decides whether the learning-rate schedule advances.
- `Precision`: the above as one object for a step: the forward under `Precision.autocast`,
  the loss backward through `backward`, the optimiser through `unscale` + `step`. Mode ``no``
  changes nothing (a no-op context, no scaling), so a trainer written against it keeps its
  bytes. The scaler is accelerate's choice (``fp16`` only) unless ``scaler`` says otherwise
  (upstream VoxCPM scales its bf16 CUDA steps too).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

MODES = ("no", "bf16", "fp16")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(device: torch.device, mode: str):
    if mode in DTYPES:
        return torch.autocast(device_type=device.type, dtype=DTYPES[mode])
    return contextlib.nullcontext()


def grad_scaler(device: torch.device, mode: str) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device.type) if mode == "fp16" else None


def scaled_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> bool:
    if scaler is None:
        optimizer.step()
        return True
    called = []
    original = optimizer.step
    # an LR scheduler wraps the instance's step to count calls: put that wrapper back
    own = "step" in vars(optimizer)

    def step(*args, **kwargs):  # accelerate's patch_optimizer_step
        called.append(True)
        return original(*args, **kwargs)

    optimizer.step = step
    try:
        scaler.step(optimizer)
        scaler.update()
    finally:
        if own:
            optimizer.step = original
        else:
            del optimizer.step  # the class's method again
    return bool(called)


class Precision:
    def __init__(self, mode: str = "no", device_type: str = "cpu", *,
                 scaler: bool | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mixed precision must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device = torch.device(device_type)
        if scaler is None:
            self.scaler = grad_scaler(self.device, mode)
        else:
            self.scaler = torch.amp.GradScaler(self.device.type) if scaler else None

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None: no autocast)."""
        return DTYPES.get(self.mode)

    def autocast(self):
        return autocast(self.device, self.mode)

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer) -> None:
        """Before clipping: the gradients in their true scale."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        """The optimiser's step (through the scaler); False when the scaler skipped it."""
        return scaled_step(optimizer, self.scaler)

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
