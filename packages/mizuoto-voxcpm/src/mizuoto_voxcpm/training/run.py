"""A prepared VoxCPM training run (what ``VoxCPMTrainer.prepare`` returns, what the session
trains), and the base-model files an export carries over.

Its own module so that the trainer and the session both import it, and not each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from mizuoto.contracts import TrainingConfig

BASE_FILES = ("config.json", "audiovae.pth", "audiovae.safetensors", "tokenizer.json",
              "special_tokens_map.json", "tokenizer_config.json")


@attrs.frozen
class Run:
    """A prepared run: where it lives and what it trains."""

    config: TrainingConfig
    model_dir: Path
    output_dir: Path
    recipe: Any
    samples: tuple = attrs.field(eq=False, repr=False)
    #: rows before the max_batch_tokens filter (upstream's epoch counter divides by these)
    counted_samples: int
    rejected: tuple[tuple[int, str], ...] = ()
    texts: tuple[str, ...] = ()
    #: the validation manifest's usable rows (none: no validation)
    val_samples: tuple = attrs.field(default=(), eq=False, repr=False)
    #: numbered checkpoints kept (0: none, -1: all, N: the newest N) and the steps between them
    keep_checkpoints: int = 0
    checkpoint_every: int = 1

