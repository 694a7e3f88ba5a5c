"""The trainer contract: fine-tune an engine's model in three stages (prepare, train, export)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import attrs

from mizuoto.contracts.progress import ProgressCallback
from mizuoto.errors import InvalidRequest

MEMORY_LEVELS = ("default", "low", "lowest")


@attrs.frozen
class TrainingConfig:
    """One fine-tuning run.

    ``method`` is one of the trainer's ``methods`` (``full``, ``lora``); ``memory`` is the
    ``training.memory`` level (``default``; ``low`` trades speed for memory, e.g. gradient
    checkpointing; ``lowest`` adds 8-bit optimiser state or CPU offload where the trainer can).
    A run in ``output_dir`` that was interrupted resumes from its last checkpoint.
    """

    method: str
    model: str
    dataset: Path = attrs.field(converter=Path)
    output_dir: Path = attrs.field(converter=Path)
    steps: int = 1000
    learning_rate: float = 1e-5
    batch_size: int = 1
    seed: int = 0
    memory: str = attrs.field(default="default")
    save_every: int = 500
    params: Mapping[str, Any] = attrs.field(factory=dict,
                                            converter=lambda v: MappingProxyType(dict(v)))

    @memory.validator
    def _memory(self, attribute, value):
        if value not in MEMORY_LEVELS:
            raise InvalidRequest("training.memory", f"must be one of {MEMORY_LEVELS}, got {value!r}")


@attrs.frozen
class TrainingResult:
    output_dir: Path
    steps_done: int
    resumed_from: int | None
    exported: Path | None = None
    metrics: Mapping[str, float] = attrs.field(factory=dict,
                                               converter=lambda v: MappingProxyType(dict(v)))


class Trainer(abc.ABC):
    """Fine-tunes models of one engine. ``methods`` lists what it supports."""

    engine: ClassVar[str]
    methods: ClassVar[frozenset[str]]
    memory_levels: ClassVar[tuple[str, ...]] = ("default",)

    def check(self, config: TrainingConfig) -> None:
        if config.method not in self.methods:
            raise InvalidRequest("method", f"{self.engine} supports {sorted(self.methods)}, "
                                 f"not {config.method!r}")
        if config.memory not in self.memory_levels:
            raise InvalidRequest("training.memory",
                                 f"{self.engine} supports {self.memory_levels}")

    @abc.abstractmethod
    def prepare(self, config: TrainingConfig, *, progress: ProgressCallback | None = None) -> Any:
        """Validate the data set and model, build manifests/features; returns a run handle."""

    @abc.abstractmethod
    def train(self, run: Any, *, progress: ProgressCallback | None = None) -> TrainingResult:
        """Train, checkpointing atomically every ``save_every`` steps; resumes if interrupted."""

    @abc.abstractmethod
    def export(self, run: Any, destination: Path) -> Path:
        """Write a model directory (atomically) that the engine can load."""
