"""The optimisation loop of upstream's ``train_voxcpm_finetune.py``, and its checkpoints.

Per step: gradients set to ``None``; ``grad_accum_steps`` micro-batches, each loss weighted by
its lambda and divided by the accumulation steps; the gradient norm clipped (at 1e9 when
clipping is off, so the norm is always computed); AdamW; the cosine schedule with warm-up. The
learning rate logged is the scheduler's after its step (the next step's), as upstream logs it.

A checkpoint holds the trainable weights, optimiser and scheduler state, the generator's state
and the data position, written as a directory that replaces ``latest`` atomically (core's ``atomic_directory``): a run killed
at any point resumes from the last checkpoint to the same bits an uninterrupted run reaches.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from mizuoto.runtime.atomic import atomic_directory, left_aside, save_safetensors
from mizuoto.training import Precision, barrier, micro_batches
from mizuoto_voxcpm.training.data import EpochSampler

CLIP_OFF = 1e9


def cosine_with_warmup(step: int, *, warmup: int, total: int) -> float:
    """``transformers.get_cosine_schedule_with_warmup``'s factor (half a cosine, floor 0)."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
    factor = factor * (1 - 0.0) + 0.0
    return max(0, factor)


class Schedule:
    """The scheduler's factor function. An object rather than a closure: ``LambdaLR`` saves an
    object's attributes in its state, so a checkpoint carries the warm-up and the length, and a
    resumed run keeps them."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        return cosine_with_warmup(step, warmup=self.warmup, total=self.total)


def build_optimizer(model: torch.nn.Module, recipe) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable weights and the cosine schedule: ``max_steps`` long (upstream's
    ``0``: ``num_iters``), which may differ from the steps run (past its end the factor rises
    again along the cosine, as upstream's does)."""
    optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad),
                                  lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    total = recipe.max_steps if recipe.max_steps > 0 else recipe.num_iters
    schedule = Schedule(recipe.warmup_steps, total)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def precision_for(device: torch.device, mixed_precision: str = "no") -> Precision:
    """``mixed_precision`` ``bf16`` (upstream's accelerator on CUDA) or ``fp16``: autocast and
    a gradient scaler (upstream's accelerator scales bf16 too); ``no`` (upstream on the CPU,
    where its ``autocast("cuda")`` is off): neither."""
    return Precision(mixed_precision, device.type, scaler=mixed_precision != "no")


def train_step(model, optimizer, scheduler, scaling: Precision, next_batch, losses_of,
               recipe, step: int, no_sync=None) -> dict[str, float]:
    """One optimiser step; returns upstream's logged values for it. ``no_sync``: DDP's
    context that skips the gradient all-reduce (all micro-batches but the last)."""
    optimizer.zero_grad(set_to_none=True)
    logged: dict[str, torch.Tensor] = {}
    for _, skip_sync in micro_batches(recipe.grad_accum_steps, no_sync):
        batch = next_batch()
        with skip_sync:
            with scaling.autocast():
                outputs = losses_of(batch, progress=step / max(1, recipe.num_iters))
            total = 0.0
            for key, value in outputs.items():
                total = total + value * recipe.lambdas.get(key, 1.0) / recipe.grad_accum_steps
                logged[key] = value.detach()
            scaling.backward(total)
    scaling.unscale(optimizer)
    max_norm = recipe.max_grad_norm if recipe.max_grad_norm > 0 else CLIP_OFF
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaling.step(optimizer)
    scheduler.step()
    values = {key: value.item() for key, value in logged.items()}
    values["lr"] = float(optimizer.param_groups[0]["lr"])
    values["grad_norm"] = float(grad_norm)
    return values


# -- checkpoints -----------------------------------------------------------------------------

CHECKPOINTS = "checkpoints"
LATEST = "latest"  # checkpoints/latest/: the resumable checkpoint
TRAINABLE = "trainable.safetensors"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().contiguous() for name, p in model.named_parameters()
            if p.requires_grad}


def save_checkpoint(latest: Path, *, model, optimizer, scheduler, scaling: Precision,
                    generator: torch.Generator, sampler: EpochSampler, step: int,
                    rank: int = 0) -> None:
    """Write folder ``latest`` whole or not at all (a new folder renamed over the old).
    Under torchrun every process adds its generator and data position; process 0 the rest."""
    staging = f".{latest.name}.staging"
    if rank == 0:
        with atomic_directory(latest, staging=staging, durable=True) as folder:
            barrier()  # the folder exists: every process writes its own file into it
            _save_own(folder, rank, generator, sampler)
            barrier()
            save_safetensors(trainable_state(model), folder / TRAINABLE)
            torch.save({"optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaling.state_dict()},
                       folder / "state.pt")
            (folder / "training_state.json").write_text(json.dumps({"step": step}),
                                                        encoding="utf-8")
    else:
        barrier()
        _save_own(latest.parent / staging, rank, generator, sampler)
        barrier()
    barrier()


def _save_own(folder: Path, rank: int, generator: torch.Generator, sampler: EpochSampler
              ) -> None:
    torch.save({"generator": generator.get_state(), "sampler": sampler.state()},
               folder / f"rank{rank}.pt")


NUMBERED = "step_{:07d}"  # checkpoints/step_<N>/, named as upstream's save_checkpoint names them


def fill_numbered(folder: Path, step: int, write_weights, *, optimizer, scheduler) -> None:
    """Upstream's files of ``step_<step>/`` into ``folder``: the weights ``write_weights(folder)``
    writes, ``optimizer.pth``, ``scheduler.pth``, ``training_state.json``."""
    write_weights(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pth")
    torch.save(scheduler.state_dict(), folder / "scheduler.pth")
    with open(folder / "training_state.json", "w", encoding="utf-8") as f:
        json.dump({"step": int(step)}, f)


def find_checkpoint(directory: Path) -> Path | None:
    # the old one left aside: killed between two renames (``latest.old``: by earlier versions)
    for candidate in (directory / LATEST, left_aside(directory / LATEST),
                      directory / f"{LATEST}.old"):
        if candidate is not None and (candidate / "training_state.json").is_file():
            return candidate
    return None


def load_checkpoint(path: Path, *, model, optimizer, scheduler, scaling: Precision,
                    generator: torch.Generator, sampler: EpochSampler, rank: int = 0) -> int:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns its step count."""
    from safetensors.torch import load_file

    tensors = load_file(str(path / TRAINABLE))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaling.load_state_dict(state["scaler"])
    own = torch.load(path / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    generator.set_state(own["generator"])
    sampler.restore(own["sampler"])
    info = json.loads((path / "training_state.json").read_text(encoding="utf-8"))
    return int(info["step"])
