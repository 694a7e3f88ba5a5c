"""Mixed-precision training: ``training.mixed_precision``, as accelerate applies it.

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
"""

from __future__ import annotations

import contextlib

import torch

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
