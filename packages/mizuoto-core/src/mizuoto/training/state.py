"""A resumable training state in one file: the model's (or only the trainable) weights, the
optimizer, the scheduler, the gradient scaler, the random generators and the step count,
written atomically (the old file or the new one, never half of one).

`save_training_state(path, step, *, model, optimizer, ...)` / `load_training_state(path, ...)
-> step`: a run resumed from it reaches the bits an uninterrupted run reaches, provided every
random draw goes through the saved generators (``generator``, and torch's global CPU and CUDA
generators, saved too). `save_state_file(path, state)` / `load_state_file(path)`: a trainer's
own state mapping (its loop's ``state_dict``), written the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mizuoto.runtime.atomic import atomic_path


def save_training_state(path: str | Path, step: int, *, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, scheduler: Any = None,
                        scaler: Any = None, generator: torch.Generator | None = None,
                        trainable_only: bool = False, extra: dict[str, Any] | None = None
                        ) -> Path:
    """Write the state to ``path`` atomically. ``trainable_only``: only parameters with
    ``requires_grad`` (a LoRA run's adapters), not the frozen base."""
    weights = ({name: p.detach().clone() for name, p in model.named_parameters()
                if p.requires_grad} if trainable_only
               else {name: t.detach().clone() for name, t in model.state_dict().items()})
    state = {
        "step": int(step), "model": weights, "trainable_only": trainable_only,
        "optimizer": optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "generator": None if generator is None else generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "extra": extra or {},
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return Path(path)


def load_training_state(path: str | Path, *, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, scheduler: Any = None,
                        scaler: Any = None, generator: torch.Generator | None = None
                        ) -> tuple[int, dict[str, Any]]:
    """Restore what :func:`save_training_state` wrote; returns ``(step, extra)``."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["trainable_only"]:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["model"].items():
                params[name].copy_(value)
    else:
        model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for target, key in ((scheduler, "scheduler"), (scaler, "scaler")):
        if target is not None and state[key] is not None:
            target.load_state_dict(state[key])
    if generator is not None and state["generator"] is not None:
        generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"]), state["extra"]


def save_state_file(path: str | Path, state: Mapping[str, Any]) -> None:
    """A trainer's own state mapping as one torch file, written atomically and flushed to the
    disk before it replaces the old one (a checkpoint on disk is always whole)."""
    with atomic_path(path) as tmp:
        torch.save(dict(state), tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())


def load_state_file(path: str | Path) -> dict[str, Any]:
    """What `save_state_file` wrote (tensors and plain values only: ``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)
