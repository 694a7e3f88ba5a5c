"""Run checkpoints: everything a killed run needs to finish with the same bytes, written
atomically (a checkpoint on disk is always whole: the old one or the new one).

`save_run_state(path, state)` / `load_run_state(path)`: a torch pickle of `FineTuning.state_dict`
(model, EMA, optimiser, schedule, torch/Python/sampler RNG states, the epoch's batch order and
position, the log). `check_output_dir(path, needed_bytes)` fails before training when the run
directory cannot be written or lacks the room for two checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from mizuoto.runtime.atomic import atomic_path

CHECKPOINT = Path("checkpoints") / "last.pt"


def save_run_state(path: str | Path, state: Mapping) -> None:
    with atomic_path(path) as tmp:
        torch.save(dict(state), tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())


def load_run_state(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
