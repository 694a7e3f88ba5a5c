"""`StepTrainer`: a `Trainer` that does the shared work of a run, as `Engine` does for synthesis.

An engine's trainer writes what is its own:

- `prepare(config)`: check the settings, build its manifests, return a run handle (any object
  with ``config``, the `TrainingConfig`); `claim_run` records the run directory's identity and
  recipe;
- `start(run, world)`: build the model, the data and the optimiser, returning a
  `TrainingSession` (one update, its state, how many updates the run makes);
- `write_export(run, folder)`: the files of its model directory.

`StepTrainer.train` then does the rest, the same way for every trainer: the process world
(torchrun's, joined), resuming from ``checkpoints/last.pt``, ``metrics.jsonl`` and TensorBoard
(the step of a row is the update's number: 1 after the first update, as progress and numbered
checkpoints count), the step loop (a save before an update is reported, SIGINT/SIGTERM saving
and stopping with one line saying how to resume), numbered checkpoints
(``checkpoints/model_<N>.pt`` copies, rotated by number: ``params.keep_last_n_checkpoints`` /
``params.checkpoint_every``), audio samples and the result. `StepTrainer.export` writes the
model directory through core's one atomic directory writer, on process 0.

A trainer whose engine declares LoRA sets ``lora_targets`` (the engine's
`mizuoto.adapters.LoRATargets`) and gets the ``lora`` method: ``params.lora_r``/``lora_alpha``/
``lora_dropout``/``lora_targets`` (`mizuoto.training.lora.LoRAParams`, checked by `check`),
`add_lora` wrapping the built model's targets (only they train: `TrainingRunner.optimize` takes
the parameters that do) and `export` writing the adapter alone, naming its base model by id and
fingerprint, from the weights `trained_weights` reads.

Checkpoints may be folders (upstream VoxCPM's ``latest/`` and ``step_<N>/``): a trainer sets
``checkpoint`` to the folder, ``numbered_checkpoint`` to the numbered name (``{}``: the update)
and ``checkpoint_folders``; its session's `TrainingSession.save` writes the folder (through
`mizuoto.runtime.atomic.atomic_directory`) and `TrainingSession.write_numbered` fills a numbered
one; `StepTrainer.find_checkpoint` may look further (e.g. a folder left aside by a killed
swap).

The contract's `Trainer` stays as it was: a trainer that implements ``prepare``/``train``/
``export`` itself keeps working.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from mizuoto.adapters import LoRATargets
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.trainer import (
    Trainer,
    TrainerParams,
    TrainingConfig,
    TrainingResult,
    checkpoint_retention,
)
from mizuoto.errors import InvalidRequest
from mizuoto.nn.lora import LoRASettings
from mizuoto.runtime.atomic import atomic_directory, atomic_path
from mizuoto.runtime.memory import release_freed_memory
from mizuoto.training.checkpoint_folder import find_checkpoint_folder
from mizuoto.training.checkpoints import rotate
from mizuoto.training.lora import (
    LoRAParams,
    LoRATrainerParams,
    add_adapters,
    lora_run_settings,
    write_lora_export,
)
from mizuoto.training.metrics import MetricsLog
from mizuoto.training.progress import StepProgress
from mizuoto.training.run_directory import (
    RunDirectory,
    RunIdentity,
    base_fingerprint,
    data_fingerprint,
)
from mizuoto.training.runner import (
    RecipeQuirks,
    TrainingRunner,
    training_device,
    training_precision,
)
from mizuoto.training.schedules import check_schedule
from mizuoto.training.session import RunnerSession, TrainingSession
from mizuoto.training.steps import Cadence, StepLoop
from mizuoto.training.world import ProcessWorld, barrier, join, process_world

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT", "NUMBERED", "RunnerSession", "StepTrainer", "TrainingSession",
           "training_device", "training_precision"]

CHECKPOINT = Path("checkpoints") / "last.pt"
NUMBERED = "model_{}.pt"  # checkpoints/model_<N>.pt, as f5-tts's


@contextlib.contextmanager
def _seeded_torch(seed: int, device) -> Iterator[None]:
    import torch

    # the device's generator too: an upstream seeding torch seeds it, and its draws count
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


class StepTrainer(Trainer):
    """See the module doc. ``checkpoint``: the resumable checkpoint, in the run directory;
    ``numbered_checkpoint``: a numbered one's name beside it (``{}``: the update, formatted);
    ``checkpoint_folders``: numbered checkpoints are folders."""

    params_class = TrainerParams
    checkpoint: ClassVar[Path] = CHECKPOINT
    numbered_checkpoint: ClassVar[str] = NUMBERED
    checkpoint_folders: ClassVar[bool] = False
    graceful_stop = True
    #: the engine's LoRA declaration (its ``AdapterHost.lora_targets``); set, the trainer has
    #: the ``lora`` method (see the module doc)
    lora_targets: ClassVar[LoRATargets | None] = None
    #: a lora run's rank, alpha and dropout where its params give none
    lora_defaults: ClassVar[LoRASettings] = LoRASettings(r=8, alpha=16, dropout=0.0)
    #: params a lora run must leave at these values (they change the base model's shape)
    lora_keeps: ClassVar[Mapping[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.lora_targets is None:
            return
        cls.methods = frozenset(getattr(cls, "methods", {"full"})) | {"lora"}
        if cls.params_class is TrainerParams:
            cls.params_class = LoRATrainerParams
        elif not issubclass(cls.params_class, LoRAParams):
            raise TypeError(f"{cls.__name__} declares lora_targets: mix "
                            "mizuoto.training.lora.LoRAParams into its params_class "
                            f"{cls.params_class.__name__}")
    #: ``compute.device`` ``auto``'s rule (a function returning the device; None: CUDA, else
    #: MPS, else the CPU, as accelerate picks)
    device_auto: ClassVar[Any] = None
    #: the mixed-precision mode ``auto`` is, by device type (absent: ``no``)
    precision_auto: ClassVar[Mapping[str, str]] = {}
    #: modes refused off CUDA, and upstream's reason in words
    precision_cuda_only: ClassVar[tuple[str, ...]] = ("fp16",)
    precision_cuda_only_why: ClassVar[str] = ""
    #: the run is built and trained with torch (and the device's generator) seeded with
    #: ``config.seed`` in a forked RNG, as an upstream that seeds torch does; the caller's
    #: generators are untouched
    seeds_torch: ClassVar[bool] = False
    #: torchrun's group joins on the training device's backend (NCCL on CUDA), as an upstream
    #: whose accelerator joins it there; off: gloo, which carries CUDA tensors too
    world_on_device: ClassVar[bool] = False

    @abc.abstractmethod
    def start(self, run: Any, world: ProcessWorld) -> TrainingSession:
        """Build the run's model, data and optimiser (every process)."""

    @abc.abstractmethod
    def write_export(self, run: Any, folder: Path) -> None:
        """Write the model directory's files into ``folder`` (empty; swapped in whole;
        process 0 only); a lora run's export is `write_lora_export`."""

    # -- what every trainer shares ------------------------------------------------------------

    def check(self, config: TrainingConfig) -> None:
        """The contract's checks, and ``params.lr_schedule`` a known schedule's name."""
        super().check(config)
        schedule = self.params_class.of(config.params)[0].lr_schedule
        if schedule is not None:
            check_schedule(schedule)
        self.lora_settings(config)

    # -- the lora method ----------------------------------------------------------------------

    def lora_settings(self, config: TrainingConfig) -> LoRASettings | None:
        """A lora run's adapters (`mizuoto.training.lora.lora_run_settings`; target patterns
        as given); None for another method, or a trainer without ``lora_targets``."""
        if self.lora_targets is None:
            return None
        return lora_run_settings(config.method, self.params_class.of(config.params)[0],
                                 self.lora_targets, defaults=self.lora_defaults,
                                 keeps=self.lora_keeps)

    def add_lora(self, run: Any, model: nn.Module) -> list[nn.Parameter] | None:
        """For a lora run: adapters on the built ``model``'s targets (under
        ``lora_targets.module``; ``lora_A`` Kaiming-uniform from a generator seeded with
        ``config.seed``, ``lora_B`` zero, so the model starts as its base) and everything else
        frozen; returns the parameters that train. None, and nothing changed, otherwise. Call
        it in `start` once the base weights are in, before `TrainingRunner.optimize`."""
        settings = self.lora_settings(run.config)
        if settings is None:
            return None
        import torch

        root = model.get_submodule(self.lora_targets.module)
        # its own generator: the model's and the data's draws stay those of a full run
        generator = torch.Generator().manual_seed(run.config.seed)
        return add_adapters(root, settings, self.lora_targets, generator)[1]

    def trained_weights(self, run: Any) -> Mapping[str, Any]:
        """The trained model's state dict in the run's checkpoint (a lora export takes its
        adapters from it). Default: `RunnerSession`'s file."""
        import torch

        state = torch.load(Path(run.config.output_dir) / self.checkpoint, map_location="cpu",
                           weights_only=True)
        return state["model"]

    def lora_base_fingerprint(self, run: Any) -> str:
        """The base weights' identity as the engine's ``AdapterHost.base_fingerprint`` gives it
        (what loading the adapter checks). Default: the base model loaded on the CPU and
        asked; a trainer that can compute it without loading overrides this."""
        from mizuoto.loading import resolve_for_engine
        from mizuoto.options import ComputeOptions, Options
        from mizuoto.registry import get_engine

        model_dir = resolve_for_engine(run.config.model, self.engine).path
        engine = get_engine(self.engine).load(
            model_dir, options=Options(compute=ComputeOptions(device="cpu")))
        return engine.base_fingerprint()

    def write_lora_export(self, run: Any, folder: Path) -> None:
        """A lora run's export: the adapter alone (`mizuoto.training.lora.write_lora_export`)."""
        write_lora_export(folder, self.trained_weights(run), self.lora_settings(run.config),
                          self.lora_targets, engine=self.engine, base_model=str(run.config.model),
                          base_fingerprint=self.lora_base_fingerprint(run))

    def device_and_precision(self, config: TrainingConfig, device=None) -> tuple[Any, str]:
        """Where a run trains and its mixed-precision mode, chosen here once for every trainer:
        ``config.compute.device`` (`training_device`; ``auto``: ``device_auto``, or CUDA, else
        MPS, else the CPU) unless ``device`` is given, and ``config.mixed_precision``
        (`training_precision`; ``auto``: ``precision_auto`` for the device type, else ``no``;
        a mode of ``precision_cuda_only`` refused off CUDA, ``precision_cuda_only_why`` saying
        why)."""
        device = self._device(config, device)
        return device, training_precision(
            config.mixed_precision, device, auto=self.precision_auto.get(device.type, "no"),
            cuda_only=self.precision_cuda_only, why=self.precision_cuda_only_why)

    def _device(self, config: TrainingConfig, device=None) -> Any:
        """``device``, else ``config.compute.device`` as `device_and_precision` chooses it."""
        import torch

        return (training_device(config.compute, auto=self.device_auto) if device is None
                else torch.device(device))

    def runner(self, run: Any, world: ProcessWorld, *, device=None,
               mixed_precision: str | None = None, grad_accumulation: int = 1,
               max_grad_norm: float = 1.0, schedule: str = "constant", warmup_updates: int = 0,
               scaler: bool | None = None, quirks: RecipeQuirks = RecipeQuirks()
               ) -> TrainingRunner:
        """The run's `TrainingRunner`: on ``device`` with the mixed-precision mode of
        `device_and_precision`, or ``mixed_precision`` as given (a mode resolved already, as
        ``prepare`` recorded it in the run), ``params.grad_accumulation``/``max_grad_norm``
        (default the given, the trainer's upstream values), ``config.memory`` and the recipe's
        ``quirks``; its
        `TrainingRunner.optimize` defaults to ``config.learning_rate``, ``params.lr_schedule``
        and ``params.warmup_updates`` (default ``schedule``, ``warmup_updates``) over
        ``config.steps`` updates."""
        config: TrainingConfig = run.config
        shared = self.params_class.of(config.params)[0]
        if mixed_precision is None:
            device, mixed_precision = self.device_and_precision(config, device)
        else:  # resolved at prepare: not chosen again (nor refused) here
            device = self._device(config, device)
        runner = TrainingRunner(
            device=device, world=world, mixed_precision=mixed_precision,
            scaler=scaler, memory=config.memory, quirks=quirks,
            grad_accumulation=shared.grad_accumulation or grad_accumulation,
            max_grad_norm=max_grad_norm if shared.max_grad_norm is None
            else shared.max_grad_norm)
        runner.schedule_defaults = {
            "learning_rate": config.learning_rate, "total": config.steps,
            "schedule": shared.lr_schedule or schedule,
            "warmup": warmup_updates if shared.warmup_updates is None else shared.warmup_updates}
        return runner

    def find_checkpoint(self, output_dir: Path) -> Path | None:
        """The resumable checkpoint run directory ``output_dir`` holds (None: none yet); a
        folder also where a kill between two renames left it aside."""
        path = Path(output_dir) / self.checkpoint
        if self.checkpoint_folders:
            return find_checkpoint_folder(path)
        return path if path.exists() else None

    def world(self, run: Any) -> ProcessWorld:
        """This process's place; under torchrun the group is joined (``world_on_device``)."""
        device = self.device_and_precision(run.config)[0].type if self.world_on_device else "cpu"
        return join(process_world(), device)

    def random_scope(self, run: Any) -> contextlib.AbstractContextManager:
        """The context the run is built and trained in (``seeds_torch``: a forked torch RNG
        seeded with ``config.seed``)."""
        if not self.seeds_torch:
            return contextlib.nullcontext()
        return _seeded_torch(run.config.seed, self.device_and_precision(run.config)[0])

    def claim_run(self, config: TrainingConfig, *, weights: Iterable[Path],
                  rows: Iterable[tuple[str, str | Path | None]],
                  recipe: Mapping[str, Any] | None = None,
                  run_dir: RunDirectory | None = None) -> RunDirectory:
        """The run directory, checked writable, its identity recorded (a resume onto other
        base weights or data is refused) and its recipe written when given."""
        if run_dir is None:
            run_dir = RunDirectory(config.output_dir)
            run_dir.check_writable()
        run_dir.claim(RunIdentity(
            engine=self.engine, method=config.method, base_model=str(config.model),
            base_fingerprint=base_fingerprint(weights), dataset=str(config.dataset),
            data_fingerprint=data_fingerprint(rows)),
            resumable=self.find_checkpoint(run_dir.path) is not None)
        if recipe is not None:
            run_dir.write_recipe(recipe, logger=self.params_class.of(config.params)[0].logger)
        return run_dir

    def train(self, run: Any, *, progress: ProgressCallback | None = None) -> TrainingResult:
        try:
            return self._run_steps(run, progress)
        finally:
            # the run's model, data and optimiser state (freed with _run_steps' frame) back to
            # the system, not kept in the heap: an export's preview or the next load would
            # find that memory taken
            release_freed_memory()

    def _run_steps(self, run: Any, progress: ProgressCallback | None) -> TrainingResult:
        config: TrainingConfig = run.config
        output = Path(config.output_dir)
        state_path = output / self.checkpoint
        keep, every = checkpoint_retention(config)
        world = self.world(run)
        prefix, _, suffix = self.numbered_checkpoint.partition("{")
        suffix = suffix.partition("}")[2]
        atomic = (functools.partial(atomic_directory, durable=True) if self.checkpoint_folders
                  else atomic_path)
        with self.random_scope(run):
            session = self.start(run, world)
            runner = session.runner
            if runner is not None and world.main:
                logger.info("training on %s, mixed precision %s, memory %s", runner.device,
                            runner.mixed_precision, runner.memory)
            found = self.find_checkpoint(output)
            start = session.load(found) if found is not None else 0
            if start and world.main:
                logger.info("resuming %s at update %d", output, start)

            def numbered(done: int) -> None:
                loop.save_now()  # a numbered checkpoint is the run checkpoint's state
                if world.main:
                    folder = state_path.parent
                    with atomic(folder / self.numbered_checkpoint.format(done)) as target:
                        session.write_numbered(target, state_path, done)
                    rotate(folder, prefix, suffix, keep=keep)

            shared, _ = self.params_class.of(config.params)
            metrics = (MetricsLog(output, resume_from=start + 1, tensorboard=shared.tensorboard)
                       if world.main else None)
            session.metrics = metrics
            loop = StepLoop(
                start=start, total=session.total, world=world,
                save=lambda done: session.save(state_path, done), numbered=numbered,
                samples=(lambda done: session.samples(done, metrics))
                if session.samples_every else None,
                cadence=Cadence(config.save_every, every, keep,
                                samples_every=session.samples_every),
                metrics=metrics, finished=session.finished, count_from=1,
                progress=StepProgress(progress, session.total, start,
                                      losses=session.progress_losses),
                stop_device=session.device)
            try:
                outcome = loop.run(session.update)
            finally:
                if metrics is not None:
                    metrics.close()
        if outcome.interrupted is not None and world.main:
            logger.info("%s: stopped at update %d, checkpoint saved in %s; train again on it "
                        "to resume", outcome.interrupted, outcome.done, output)
        return TrainingResult(output, outcome.done, start or None,
                              metrics=session.result_metrics(loop.values),
                              interrupted=outcome.interrupted)

    def export(self, run: Any, destination: Path) -> Path:
        """The trained model directory, replacing ``destination`` whole (process 0 writes)."""
        if self.find_checkpoint(run.config.output_dir) is None:
            raise InvalidRequest("output_dir", f"{run.config.output_dir} holds no checkpoint "
                                 "to export", "train first")
        if self.world(run).main:
            with atomic_directory(destination) as folder:
                if self.lora_settings(run.config) is not None:
                    self.write_lora_export(run, folder)
                else:
                    self.write_export(run, folder)
        barrier()
        return Path(destination)
