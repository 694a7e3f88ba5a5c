"""Run checkpoints: everything a killed run needs to finish with the same bytes, written
atomically (a checkpoint on disk is always whole: the old one or the new one).

`save_run_state(path, state)` / `load_run_state(path)`: a torch pickle of `FineTuning.state_dict`
(model, EMA, optimiser, schedule, torch/Python/sampler RNG states, the epoch's batch order and
position, the log). `check_output_dir(path, needed_bytes)` fails before training when the run
directory cannot be written or lacks the room for two checkpoints.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from mizuoto.errors import InvalidRequest
from mizuoto.runtime.atomic import atomic_path

CHECKPOINT = Path("checkpoints") / "last.pt"


def save_run_state(path: str | Path, state: Mapping) -> None:
    with atomic_path(path) as tmp:
        torch.save(dict(state), tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())


def load_run_state(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def check_output_dir(path: str | Path, needed_bytes: int = 0) -> None:
    """Raise `InvalidRequest` (``output_dir``) if ``path`` is not a writable directory with
    ``needed_bytes`` free."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".mizuoto-write-test-{os.getpid()}"
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as exc:
        raise InvalidRequest("output_dir", f"cannot write to {path}: {exc.strerror or exc}",
                             "choose a writable directory with free space") from exc
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise InvalidRequest("output_dir", f"{path} has {free / 2**20:.0f} MiB free; the run's "
                             f"checkpoints need about {needed_bytes / 2**20:.0f} MiB",
                             "free some space or choose another directory")
