"""The training toolkit: what every trainer needs besides its model and data.

- `world`: the run's processes (one, or torchrun's over gloo or NCCL), `barrier`, `gather`;
- `steps`: the loop skeleton (`StepLoop`: metrics, progress, saves, numbered checkpoints,
  interruption after each update) and `micro_batches` (gradient accumulation);
- `precision`: the autocast context and gradient-scaler hooks of a step (`Precision`);
- `run_directory`: the run's identity (base weights and data set fingerprints; a resume onto
  others is refused), its effective recipe, the writability check;
- `checkpoints`: numbered checkpoints and their rotation;
- `metrics`: ``metrics.jsonl`` and TensorBoard event files (the ``tensorboard`` extra);
- `progress`: the ``train`` progress line with loss, rate and ETA;
- `recipe`: a trainer's settings from ``--param KEY=VALUE`` and ``--config FILE``.

docs/plugins.md ("Training toolkit") shows a trainer built on it.
"""

from mizuoto.training.checkpoints import numbered, rotate
from mizuoto.training.metrics import MetricsLog, read_metrics, tensorboard_available
from mizuoto.training.precision import Precision
from mizuoto.training.progress import StepProgress
from mizuoto.training.run_directory import (
    RunDirectory,
    RunIdentity,
    base_fingerprint,
    data_fingerprint,
)
from mizuoto.training.steps import Cadence, LoopOutcome, StepLoop, micro_batches
from mizuoto.training.world import ProcessWorld, barrier, gather, join, process_world

__all__ = [
    "Cadence", "LoopOutcome", "MetricsLog", "Precision", "ProcessWorld", "RunDirectory",
    "RunIdentity", "StepLoop", "StepProgress", "barrier", "base_fingerprint",
    "data_fingerprint", "gather", "join", "micro_batches", "numbered", "process_world",
    "read_metrics", "rotate", "tensorboard_available",
]
