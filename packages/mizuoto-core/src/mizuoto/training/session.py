"""What `StepTrainer.start` returns: a `TrainingSession` (one run in memory: one update, its
state, how many updates the run makes), or a `RunnerSession`, a session that is only model +
data + loss on core's `TrainingRunner` and writes the checkpoint itself.
"""

from __future__ import annotations

import abc
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mizuoto.errors import InvalidRequest
from mizuoto.runtime.atomic import atomic_path
from mizuoto.training.epoch_position import EpochPosition
from mizuoto.training.metrics import MetricsLog
from mizuoto.training.runner import TrainingRunner
from mizuoto.training.state import load_state_file, save_state_file
from mizuoto.training.world import barrier, gather


class TrainingSession(abc.ABC):
    """One run in memory, built by `StepTrainer.start`: the model, optimiser and data.

    ``total``: the updates the run makes. `update` makes one whole optimiser update and
    returns the values it logs; `save`/`load` write and restore everything a resumed run needs
    to reach the bytes of an uninterrupted one (`save` runs on every process: it may be a
    collective; it writes ``path`` atomically, e.g. `mizuoto.training.save_training_state`).
    """

    total: int
    #: updates between audio samples (`samples`); 0: none
    samples_every: int = 0
    #: the loss keys the progress line shows
    progress_losses: tuple[str, ...] = ("loss",)
    #: where the interruption's all-reduce runs (None: the CPU)
    device: Any = None
    #: the run's `TrainingRunner` (optimiser, schedule, precision), when the session has one
    runner: TrainingRunner | None = None
    #: process 0's metrics log (None elsewhere), set by `StepTrainer.train` before the loop
    metrics: MetricsLog | None = None

    @abc.abstractmethod
    def update(self) -> Mapping[str, float]:
        """One optimiser update (its micro-batches, clipping, the optimiser and schedule)."""

    @abc.abstractmethod
    def save(self, path: Path, done: int) -> None:
        """Write the resumable state after ``done`` updates to ``path``."""

    @abc.abstractmethod
    def load(self, path: Path) -> int:
        """Restore the state ``save`` wrote; returns the updates it holds."""

    def finished(self, done: int) -> bool:
        return done >= self.total

    def write_numbered(self, target: Path, checkpoint: Path, done: int) -> None:
        """Fill numbered checkpoint ``target`` (process 0; a temporary path, or an empty folder
        with ``checkpoint_folders``, swapped in whole) after update ``done``; ``checkpoint``
        (the resumable one) was just saved. Default: a copy of it."""
        shutil.copyfile(checkpoint, target)

    def samples(self, done: int, metrics: MetricsLog | None) -> None:
        """Audio samples after update ``done`` (process 0; called when ``samples_every`` is
        set), also into ``metrics``' TensorBoard; they must draw no number of the run's own
        generators."""
        raise NotImplementedError(f"{type(self).__name__} sets samples_every: write samples()")

    def result_metrics(self, values: Mapping[str, float]) -> Mapping[str, float]:
        """The result's metrics from the last update's ``values`` (empty when it made none)."""
        return values


class RunnerSession(TrainingSession):
    """A session that is only model + data + loss, on ``runner`` (`TrainingRunner`, its
    `optimize` called): `update` is ``runner.update(next_batch, loss, weights=weights)``;
    `save`/`load` write and restore, in one file (`save_state_file`), ``model``'s weights
    (``trainable_only``: those that train), the runner's state (optimiser, schedule, scaler,
    EMA), every process's random ``generators`` (a sampler's, a ``random.Random``) with torch's
    own, and ``position`` (an `EpochPosition`: then its micro-batches make each update).
    ``recipe``: what a resumed run must share with the one it resumes; other settings are
    refused by name before anything is loaded. ``batch_log``: a JSONL file of every
    micro-batch's ``update``, ``progress_losses`` and ``lr`` as a loop logging each batch sees
    them (the update count and learning rate before the update; the last micro-batch's after
    it), kept in the checkpoint as ``records`` and rewritten at each save. ``samples``:
    `TrainingSession.samples` as ``samples(model, done, metrics)``."""

    def __init__(self, runner: TrainingRunner, model, *, total: int, next_batch, loss,
                 generators: Mapping[str, Any] | None = None,
                 weights: Mapping[str, float] | None = None, trainable_only: bool = False,
                 position: EpochPosition | None = None,
                 recipe: Mapping[str, Any] | None = None, batch_log: Path | None = None,
                 samples: Callable[..., Any] | None = None, samples_every: int = 0) -> None:
        self.runner, self.model, self.total = runner, model, total
        self.next_batch, self.loss, self.weights = next_batch, loss, weights
        self.generators = dict(generators or {})
        self.trainable_only = trainable_only
        self.position, self.recipe, self.batch_log = position, recipe, batch_log
        self.write_samples, self.samples_every = samples, samples_every if samples else 0
        self.done = 0
        self.records: list[tuple] = []  # with batch_log: (update, *losses, lr) per micro-batch

    def update(self) -> Mapping[str, float]:
        count = None if self.position is None else self.position.micro_batches()
        lr, before, losses = self.runner.scheduler.get_last_lr()[0], self.done, []

        def loss(batch):
            values = self.loss(batch)
            losses.append([values[key].detach() for key in self.progress_losses])
            return values

        values = self.runner.update(self.next_batch, loss if self.batch_log else self.loss,
                                    weights=self.weights, micro_batches_count=count)
        self.done += 1
        if self.position is not None:
            self.position.update += 1
        if self.batch_log is not None:
            self.records += [(before, *(v.item() for v in row), lr) for row in losses[:-1]]
            self.records.append((self.done, *(values[k] for k in self.progress_losses),
                                 values["lr"]))
        return values

    def samples(self, done: int, metrics: MetricsLog | None) -> None:
        self.write_samples(self.model, done, metrics)

    def result_metrics(self, values: Mapping[str, float]) -> Mapping[str, float]:
        """``values``; with nothing trained, the last record's."""
        if values or not self.records:
            return values
        return dict(zip((*self.progress_losses, "lr"), self.records[-1][1:], strict=True))

    def state(self, done: int) -> dict[str, Any]:
        """What process 0 saves after update ``done`` (every process's generators gathered
        first); a subclass adds its own entries."""
        weights = {name: p.detach().clone() for name, p in self.model.named_parameters()
                   if p.requires_grad} if self.trainable_only else self.model.state_dict()
        state = {"update": done, "model": weights, **self.runner.state_dict()}
        if self.position is not None:
            state["position"] = self.position.state_dict()
        if self.recipe is not None:
            state["settings"] = dict(self.recipe)
        if self.batch_log is not None:
            state["records"] = list(self.records)
        return state

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` saved (every process; the generators are set after)."""
        self.model.load_state_dict(state["model"], strict=not self.trainable_only)
        self.runner.load_state_dict(state)
        if self.position is not None:
            self.position.load_state_dict(state["position"])
        if self.batch_log is not None:
            self.records = [tuple(record) for record in state["records"]]

    def save(self, path: Path, done: int) -> None:
        world = self.runner.world
        rng = gather(self.runner.rng_state(**self.generators), world)  # every process's
        if world.main:
            save_state_file(path, {**self.state(done), "rng": rng})
            if self.batch_log is not None:
                names = ("update", *self.progress_losses, "lr")
                with atomic_path(self.batch_log) as tmp:
                    tmp.write_text("".join(json.dumps(dict(zip(names, r, strict=True))) + "\n"
                                           for r in self.records), encoding="utf-8")
        barrier()  # the checkpoint is whole on disk when any process goes on

    def load(self, path: Path) -> int:
        state, world = load_state_file(path), self.runner.world
        if "rng" not in state:  # e.g. F5's own session's, before it ran on this one
            raise InvalidRequest("output_dir", f"{path} was written by an older trainer",
                                 "finish the run with the version that started it, or train "
                                 "into another directory")
        if self.recipe is not None and state.get("settings") != dict(self.recipe):
            raise InvalidRequest("output_dir", f"{path} holds a run with other settings "
                                 f"({state.get('settings')})", "resume it with the "
                                 "same ones or use another directory")
        if len(state["rng"]) != world.size:
            raise InvalidRequest("output_dir", f"{path} holds a run of {len(state['rng'])} "
                                 f"process(es)", f"resume it with as many, not {world.size}")
        self.restore(state)
        self.runner.set_rng_state(state["rng"][world.rank], **self.generators)
        self.done = int(state["update"])
        return self.done
