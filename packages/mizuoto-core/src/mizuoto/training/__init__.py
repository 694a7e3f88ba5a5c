"""The training toolkit: what every trainer needs besides its model and data.

- `world`: the run's processes (one, or torchrun's over gloo or NCCL), `barrier`, `gather`;
- `steps`: the loop skeleton (`StepLoop`: metrics, progress, saves, numbered checkpoints,
  interruption after each update) and `micro_batches` (gradient accumulation);
- `runner`: `TrainingRunner`, the update (device, process world, precision, accumulation,
  clipping, optimiser and schedule, EMA, memory levels), with `RecipeQuirks`;
- `precision`: mixed precision, accelerate's autocast and gradient scaler (`Precision`);
- `schedules`: learning-rate schedules by name; `ema`: an EMA copy of the weights;
  `memory`: activation checkpointing and optimiser state on the host;
- `run_directory`: the run's identity (base weights and data set fingerprints; a resume onto
  others is refused), its effective recipe, the writability check;
- `checkpoints`: numbered checkpoints and their rotation; `checkpoint_folder`: a resumable
  checkpoint as a folder, each torchrun process's own state in it;
- `metrics`: ``metrics.jsonl`` and TensorBoard event files (the ``tensorboard`` extra);
- `progress`: the ``train`` progress line with loss, rate and ETA;
- `manifest`: the data set's rows from a JSONL manifest or a ``metadata.csv``, a folder's
  training and validation manifests; `synthetic_data`: tone clips for tests;
- `epoch_position`: where a run stands in its epochs and the micro-batches of its next update
  (`EpochPosition`, as accelerate counts them; sharded under torchrun);
- `loader_order`: torch's shuffling ``DataLoader`` draws, without one; `init_draws`: the
  draws of PyTorch's default initialisations, replayed;
- `frozen_weights`: a LoRA run's frozen linear weights in the autocast dtype or host memory;
- `validation`: a validation pass; `audio_samples`: samples written while training;
  `preview`: an exported model speaking a training text;
- `state`: a resumable training state (weights, optimizer, scheduler, RNG) in one file;
- `recipe`: a trainer's settings from ``--param KEY=VALUE`` and ``--config FILE``;
- `session`: `TrainingSession`, what an engine's trainer builds (one update, its state), and
  `RunnerSession`, one that is only model + data + loss on the runner;
- `trainer`: `StepTrainer`, the `Trainer` base class doing all of the above for a run.

docs/plugins.md ("Training toolkit") shows a trainer built on it.
"""

from mizuoto.training.checkpoints import numbered, rotate
from mizuoto.training.epoch_position import EpochPosition
from mizuoto.training.manifest import ManifestRow, find_manifest, read_manifest
from mizuoto.training.metrics import MetricsLog, read_metrics, tensorboard_available
from mizuoto.training.precision import Precision
from mizuoto.training.progress import StepProgress
from mizuoto.training.run_directory import (
    RunDirectory,
    RunIdentity,
    base_fingerprint,
    data_fingerprint,
)
from mizuoto.training.runner import (
    LossForward,
    RecipeQuirks,
    TrainingRunner,
    training_device,
    training_precision,
)
from mizuoto.training.schedules import SCHEDULES, build_schedule
from mizuoto.training.session import RunnerSession, TrainingSession
from mizuoto.training.state import load_training_state, save_training_state
from mizuoto.training.steps import (
    Cadence,
    LoopOutcome,
    StepLoop,
    micro_batches,
    warn_long_warmup,
)
from mizuoto.training.trainer import StepTrainer
from mizuoto.training.world import ProcessWorld, barrier, gather, join, process_world

__all__ = [
    "Cadence", "EpochPosition",
    "LoopOutcome", "LossForward", "RecipeQuirks", "RunnerSession", "SCHEDULES", "TrainingRunner",
    "build_schedule",
    "training_device", "training_precision", "ManifestRow", "MetricsLog", "Precision", "ProcessWorld", "RunDirectory",
    "RunIdentity", "StepLoop", "StepProgress", "barrier", "base_fingerprint",
    "data_fingerprint", "find_manifest", "gather", "join", "load_training_state",
    "micro_batches", "numbered", "process_world", "read_manifest", "read_metrics", "rotate",
    "save_training_state", "StepTrainer", "tensorboard_available", "TrainingSession",
    "warn_long_warmup",
]
