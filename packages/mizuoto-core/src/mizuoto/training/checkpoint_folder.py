"""A resumable checkpoint as a folder, written whole or not at all, for runs whose processes
each hold their own random state and data position (a torchrun world).

`save_checkpoint_folder(folder, step, *, model, runner, own)` writes, into a new folder renamed
over ``folder`` (core's ``atomic_directory``): the trainable weights
(``trainable.safetensors``), the runner's optimiser, scheduler and scaler state
(``state.pt``), the step count (``training_state.json``) and every process's ``own`` state
(``rank<r>.pt``: its generators' states, its sampler's position). `load_checkpoint_folder`
restores them and returns ``(step, own)``; `find_checkpoint_folder` finds the folder, also
where a run was killed between the two renames of a save. `write_step_files` fills a numbered
folder with the optimiser and schedule in torch's own files, readable without Mizuoto.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mizuoto.runtime.atomic import atomic_directory, left_aside, save_safetensors
from mizuoto.training.runner import TrainingRunner
from mizuoto.training.world import barrier

TRAINABLE = "trainable.safetensors"
STEP_FILE = "training_state.json"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train, by name (a LoRA run's adapters, a full run's weights)."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters()
            if p.requires_grad}


def save_checkpoint_folder(folder: Path, step: int, *, model: torch.nn.Module,
                           runner: TrainingRunner, own: dict[str, Any], rank: int = 0) -> None:
    """Write ``folder`` whole or not at all. Under torchrun every process adds its ``own``
    state; process 0 the rest (every process calls it)."""
    staging = f".{folder.name}.staging"
    if rank == 0:
        with atomic_directory(folder, staging=staging, durable=True) as target:
            barrier()  # the folder exists: every process writes its own file into it
            torch.save(own, target / f"rank{rank}.pt")
            barrier()
            save_safetensors(trainable_state(model), target / TRAINABLE)
            torch.save(runner.state_dict(), target / "state.pt")
            (target / STEP_FILE).write_text(json.dumps({"step": step}), encoding="utf-8")
    else:
        barrier()
        torch.save(own, folder.parent / staging / f"rank{rank}.pt")
        barrier()
    barrier()


def write_step_files(folder: Path, step: int, runner: TrainingRunner) -> None:
    """``optimizer.pth`` and ``scheduler.pth`` (``torch.save`` of their state dicts) and
    ``training_state.json`` (``{"step": step}``) in ``folder``: a numbered checkpoint as a
    plain PyTorch loop writes one (upstream VoxCPM's ``step_<N>/``)."""
    torch.save(runner.optimizer.state_dict(), folder / "optimizer.pth")
    torch.save(runner.scheduler.state_dict(), folder / "scheduler.pth")
    (folder / STEP_FILE).write_text(json.dumps({"step": int(step)}), encoding="utf-8")


def find_checkpoint_folder(folder: Path) -> Path | None:
    """``folder``, or the old one left aside when a run was killed between two renames
    (``<name>.old``: by earlier versions); None when there is none."""
    for candidate in (folder, left_aside(folder), folder.parent / f"{folder.name}.old"):
        if candidate is not None and (candidate / STEP_FILE).is_file():
            return candidate
    return None


def load_trainable(folder: Path, model: torch.nn.Module) -> None:
    """The trained weights of the checkpoint ``folder`` into ``model``."""
    from safetensors.torch import load_file

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in load_file(str(folder / TRAINABLE)).items():
            params[name].copy_(value)


def load_checkpoint_folder(folder: Path, *, model: torch.nn.Module, runner: TrainingRunner,
                           rank: int = 0) -> tuple[int, dict[str, Any]]:
    """Restore what `save_checkpoint_folder` wrote; returns its step count and this process's
    ``own`` state."""
    load_trainable(folder, model)
    runner.load_state_dict(torch.load(folder / "state.pt", map_location="cpu",
                                      weights_only=True))
    own = torch.load(folder / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    info = json.loads((folder / STEP_FILE).read_text(encoding="utf-8"))
    return int(info["step"]), own
