"""Upstream's ``train_voxcpm_finetune.py`` checkpoints, for a run on core's `TrainingRunner`.

(The update itself is the runner's: ``grad_accum_steps`` micro-batches, each loss weighted by
its lambda and divided by the accumulation steps; clipping, AdamW and the ``cosine`` schedule;
the recipe's quirks are `mizuoto_voxcpm.training.session.QUIRKS`.)

A checkpoint holds the trainable weights, the runner's optimiser, scheduler and scaler state,
the generator's state and the data position, written as a directory that replaces ``latest``
atomically (core's ``atomic_directory``): a run killed at any point resumes from the last
checkpoint to the same bits an uninterrupted run reaches.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mizuoto.runtime.atomic import atomic_directory, left_aside, save_safetensors
from mizuoto.training import TrainingRunner, barrier
from mizuoto_voxcpm.training.data import EpochSampler

# -- checkpoints -----------------------------------------------------------------------------

CHECKPOINTS = "checkpoints"
LATEST = "latest"  # checkpoints/latest/: the resumable checkpoint
TRAINABLE = "trainable.safetensors"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().contiguous() for name, p in model.named_parameters()
            if p.requires_grad}


def save_checkpoint(latest: Path, *, model, runner: TrainingRunner,
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
            torch.save(runner.state_dict(), folder / "state.pt")
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


def load_checkpoint(path: Path, *, model, runner: TrainingRunner,
                    generator: torch.Generator, sampler: EpochSampler, rank: int = 0) -> int:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns its step count."""
    from safetensors.torch import load_file

    tensors = load_file(str(path / TRAINABLE))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)
    runner.load_state_dict(torch.load(path / "state.pt", map_location="cpu",
                                      weights_only=True))
    own = torch.load(path / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    generator.set_state(own["generator"])
    sampler.restore(own["sampler"])
    info = json.loads((path / "training_state.json").read_text(encoding="utf-8"))
    return int(info["step"])
