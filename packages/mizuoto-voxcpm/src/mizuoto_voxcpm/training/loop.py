"""Upstream's ``train_voxcpm_finetune.py`` checkpoint folders, for a run on core's
`TrainingRunner`.

(The update itself is the runner's: ``grad_accum_steps`` micro-batches, each loss weighted by
its lambda and divided by the accumulation steps; clipping, AdamW and the ``cosine`` schedule;
the recipe's quirks are `mizuoto_voxcpm.training.session.QUIRKS`.)

``checkpoints/latest/`` is the resumable checkpoint, core's checkpoint folder
(`mizuoto.training.checkpoint_folder`: trainable weights, the runner's state, each process's
generator and data position; a run killed at any point resumes from it to the same bits an
uninterrupted run reaches). ``checkpoints/step_<N>/`` are upstream's numbered folders.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHECKPOINTS = "checkpoints"
LATEST = "latest"  # checkpoints/latest/: the resumable checkpoint
NUMBERED = "step_{:07d}"  # checkpoints/step_<N>/, named as upstream's save_checkpoint names them


def fill_numbered(folder: Path, step: int, write_weights, *, optimizer, scheduler) -> None:
    """Upstream's files of ``step_<step>/`` into ``folder``: the weights ``write_weights(folder)``
    writes, ``optimizer.pth``, ``scheduler.pth``, ``training_state.json``."""
    write_weights(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pth")
    torch.save(scheduler.state_dict(), folder / "scheduler.pth")
    with open(folder / "training_state.json", "w", encoding="utf-8") as f:
        json.dump({"step": int(step)}, f)
