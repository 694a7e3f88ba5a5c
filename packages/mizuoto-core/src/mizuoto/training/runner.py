"""`TrainingRunner`: the update, run by the core, as accelerate's ``Accelerator`` runs it for a
training script. A trainer gives the model (`wrap`, `optimize`), the data (micro-batches, in
its upstream's draw order) and the loss of one batch; the runner owns the rest:

- the device and the mixed-precision mode (`training_device`, `training_precision`: chosen
  here, once, for every trainer) and the autocast dtype and gradient scaler
  (`mizuoto.training.precision.Precision`);
- the process world: the model wrapped once in ``DistributedDataParallel`` under torchrun (gloo
  on the CPU, NCCL on CUDA; `mizuoto.training.world`);
- gradient accumulation: each micro-batch's loss divided by ``grad_accumulation``, the
  gradient all-reduce skipped (``no_sync``) on all but the last micro-batch of an update;
- clipping: the gradient norm is computed and reported every update; ``max_grad_norm`` 0 is
  clipping off;
- the optimiser (AdamW) and the learning-rate schedule, by name (`mizuoto.training.schedules`);
- an EMA copy of the weights when asked (`keep_ema`; `mizuoto.training.ema`);
- ``training.memory``: ``low`` recomputes the blocks the trainer names and keeps the EMA on the
  host; ``lowest`` also keeps the optimiser's state there between updates
  (`mizuoto.training.memory`); a LoRA run's frozen weights in the autocast dtype or host
  memory (`place_model`);
- checkpoints: `state_dict` holds the optimiser, schedule, scaler and EMA; `rng_state` the
  random generators (torch's, the device's and the trainer's own: a sampler's, a Python
  ``random.Random``).

Where an upstream recipe does something unusual, the trainer declares it in `RecipeQuirks`
(each field named for the quirk, off by default) instead of writing its own loop.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch
from torch import nn

from mizuoto.errors import InvalidRequest
from mizuoto.training.ema import EMA
from mizuoto.training.frozen_weights import frozen_linears_to, stream_frozen_linears
from mizuoto.training.memory import OptimizerStateOffload, checkpoint_activations
from mizuoto.training.precision import Precision
from mizuoto.training.schedules import build_schedule
from mizuoto.training.steps import micro_batches
from mizuoto.training.world import ProcessWorld


def training_device(compute, *, auto=None) -> torch.device:
    """``compute.device`` (`mizuoto.runtime.device.select_device`; ``auto``: the trainer's
    rule, default CUDA, else MPS, else the CPU); under torchrun each process takes its own GPU
    (``LOCAL_RANK``), as accelerate does."""
    from mizuoto.runtime.device import select_device
    from mizuoto.training.world import process_world

    device = select_device(compute) if auto is None else select_device(compute, auto=auto)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", process_world().local_rank)
    return device


def training_precision(requested: str, device, *, auto: str = "no",
                       cuda_only: tuple[str, ...] = ("fp16",), why: str = "") -> str:
    """The mixed-precision mode a run applies: ``requested`` (``TrainingConfig.
    mixed_precision``), ``auto`` the trainer's upstream default on ``device``; a mode in
    ``cuda_only`` off CUDA is refused (``why``: upstream's reason, in words)."""
    mode = auto if requested == "auto" else requested
    if mode in cuda_only and device.type != "cuda":
        raise InvalidRequest("training.mixed_precision", f"{mode} needs a CUDA device, not "
                             f"{device.type}{f' ({why})' if why else ''}",
                             f"use {' or '.join(m for m in ('bf16', 'no') if m not in cuda_only)}")
    return mode


@attrs.frozen
class RecipeQuirks:
    """What an upstream recipe does unlike accelerate's defaults, declared so that a trainer
    matching it keeps the runner's loop. Each off by default."""

    #: the learning rate logged with an update is the schedule's after its step, the next
    #: update's (f5-tts's ``get_last_lr()``, VoxCPM's ``param_groups[0]["lr"]``), not the one
    #: the update used
    logs_next_update_lr: bool = False
    #: with clipping off, clip at this norm anyway (VoxCPM clips at 1e9, so the gradients are
    #: unscaled and the norm always comes from ``clip_grad_norm_``)
    clip_at_when_off: float | None = None
    #: with clipping off, the reported norm is of the still-scaled gradients (f5-tts: accelerate
    #: unscales only inside ``clip_grad_norm_``)
    norm_of_scaled_gradients_when_clipping_off: bool = False
    #: the schedule steps even when the gradient scaler skipped the update (VoxCPM steps its
    #: scheduler unconditionally; accelerate does not)
    schedule_steps_on_skipped_update: bool = False
    #: a gradient scaler runs under bf16 autocast too (VoxCPM's; accelerate scales fp16 only)
    scales_bf16: bool = False


class LossForward(nn.Module):
    """``loss(model, *args)`` as a module call, so that `TrainingRunner.wrap` wraps the whole
    training forward (DDP's hooks see ``model``'s parameters) when the loss is a function of
    the model rather than its ``forward``."""

    def __init__(self, model: nn.Module, loss: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self._loss = loss

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._loss(self.model, *args, **kwargs)


class TrainingRunner:
    """See the module doc. ``scaler``: whether a gradient scaler runs (None: accelerate's rule,
    ``fp16`` only)."""

    def __init__(self, *, device: torch.device | str = "cpu", world: ProcessWorld | None = None,
                 mixed_precision: str = "no", scaler: bool | None = None,
                 grad_accumulation: int = 1, max_grad_norm: float = 0.0,
                 memory: str = "default", quirks: RecipeQuirks = RecipeQuirks()) -> None:
        self.device = torch.device(device)
        self.world = world or ProcessWorld()
        if scaler is None and quirks.scales_bf16 and mixed_precision == "bf16":
            scaler = True
        self.precision = Precision(mixed_precision, self.device.type, scaler=scaler)
        self.grad_accumulation = grad_accumulation
        self.max_grad_norm = max_grad_norm
        self.memory = memory
        self.quirks = quirks
        self.model: nn.Module | None = None
        self.no_sync: Callable | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.ema: EMA | None = None
        self._offload: OptimizerStateOffload | None = None
        self._parameters: list[nn.Parameter] = []
        self.grad_norm = 0.0  # the last update's, before clipping
        #: `optimize`'s settings when not given (learning_rate, schedule, warmup, total)
        self.schedule_defaults: dict[str, Any] = {}

    @property
    def mixed_precision(self) -> str:
        return self.precision.mode

    # -- the model and the optimiser --------------------------------------------------------

    def checkpoint_activations(self, blocks: Iterable[nn.Module],
                               generator: torch.Generator | None = None) -> int:
        """Under ``training.memory`` ``low``/``lowest``: recompute ``blocks`` in the backward
        pass (`mizuoto.training.memory.checkpoint_activations`); returns how many."""
        return 0 if self.memory == "default" else checkpoint_activations(blocks, generator)

    def place_model(self, model: nn.Module, *, kinds: tuple[type[nn.Module], ...] = (),
                    keep: tuple[nn.Module, ...] = ()) -> nn.Module:
        """``model`` on the training device in train mode, its frozen linear layers (a LoRA
        run's base; ``kinds``: wrappers counted as linear) in less memory with the same bits
        (`mizuoto.training.frozen_weights`): under ``training.memory`` ``low``/``lowest`` and
        autocast stored in the autocast dtype; under ``lowest`` kept in host memory, copied in
        for each call (one process only). ``keep``: layers read for the device or dtype."""
        if self.memory != "default" and self.precision.dtype is not None:
            frozen_linears_to(model, self.precision.dtype, kinds=kinds)
        model = model.to(self.device).train()
        if self.memory == "lowest":
            if self.world.distributed:
                raise InvalidRequest("training.memory", "lowest streams frozen weights from "
                                     "host memory in a single process only (not under "
                                     "torchrun)", "use low")
            stream_frozen_linears(model, self.device, keep=keep, kinds=kinds)
        return model

    def wrap(self, module: nn.Module, *, find_unused_parameters: bool = False) -> nn.Module:
        """``module`` as the training forward calls it: itself in one process, wrapped once in
        ``DistributedDataParallel`` under torchrun (then `no_sync` skips the all-reduce)."""
        if not self.world.distributed:
            return module
        if self.no_sync is not None:
            raise RuntimeError("TrainingRunner.wrap: the model is already wrapped")
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(
            module, device_ids=ids, find_unused_parameters=find_unused_parameters)
        self.no_sync = ddp.no_sync
        return ddp

    def keep_ema(self, model: nn.Module) -> EMA:
        """An EMA copy of ``model`` (on the host under ``training.memory`` low/lowest), updated
        after every update; keep it before `wrap` (DDP's hooks stay on the trained model)."""
        self.ema = EMA(model, device="cpu" if self.memory != "default" else None)
        return self.ema

    def optimize(self, model: nn.Module, *, learning_rate: float | None = None,
                 schedule: str | None = None, warmup: int | None = None,
                 total: int | None = None, weight_decay: float = 0.01,
                 fused: bool | None = None, parameters: Iterable[nn.Parameter] | None = None
                 ) -> torch.optim.Optimizer:
        """AdamW over ``parameters`` (default: those of ``model`` that train) and the named
        ``schedule`` (``warmup`` updates of ``total``). ``model``: what the EMA follows. A
        setting not given is the run's (``schedule_defaults``, from `StepTrainer.runner`)."""
        given = {"learning_rate": learning_rate, "schedule": schedule, "warmup": warmup,
                 "total": total}
        settings = {**self.schedule_defaults, **{k: v for k, v in given.items() if v is not None}}
        missing = sorted(set(given) - set(settings))
        if missing:
            raise TypeError(f"TrainingRunner.optimize: give {', '.join(missing)}")
        learning_rate, schedule = settings["learning_rate"], settings["schedule"]
        warmup, total = settings["warmup"], settings["total"]
        self.model = model
        self._parameters = list(parameters if parameters is not None else
                                (p for p in model.parameters() if p.requires_grad))
        self.optimizer = torch.optim.AdamW(self._parameters, lr=learning_rate,
                                           weight_decay=weight_decay, fused=fused)
        self.scheduler = build_schedule(schedule, self.optimizer, warmup=warmup, total=total)
        if self.memory == "lowest":
            self._offload = OptimizerStateOffload(self.optimizer, self.device)
        return self.optimizer

    # -- one update ------------------------------------------------------------------------

    def update(self, next_batch: Callable[[], Any], loss: Callable[[Any], Mapping[str, Any]],
               *, micro_batches_count: int | None = None,
               weights: Mapping[str, float] | None = None) -> dict[str, float]:
        """One optimiser update over ``micro_batches_count`` micro-batches (default
        ``grad_accumulation``), each drawn by ``next_batch()`` when its turn comes. ``loss``
        returns a batch's named losses (under autocast); their sum, each times its
        ``weights`` entry (default 1), divided by ``grad_accumulation``, goes backward.
        Returns the last micro-batch's losses, ``lr`` and ``grad_norm`` (before clipping)."""
        count = self.grad_accumulation if micro_batches_count is None else micro_batches_count
        weights = weights or {}
        logged: dict[str, torch.Tensor] = {}
        for _, skip_sync in micro_batches(count, self.no_sync):
            batch = next_batch()
            with skip_sync:
                with self.precision.autocast():
                    losses = loss(batch)
                terms = [value * weights[key] if key in weights else value
                         for key, value in losses.items()]
                self.precision.backward(functools.reduce(lambda a, b: a + b, terms)
                                        / self.grad_accumulation)
            logged = {key: value.detach() for key, value in losses.items()}
        used_lr = self.optimizer.param_groups[0]["lr"]
        self.grad_norm = float(self._clip())
        if self._offload is not None:
            self._offload.to_device()
        stepped = self.precision.step(self.optimizer)
        if stepped or self.quirks.schedule_steps_on_skipped_update:
            self.scheduler.step()
        if self._offload is not None:
            self._offload.to_host()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        values = {key: value.item() for key, value in logged.items()}
        values["lr"] = float(self.optimizer.param_groups[0]["lr"]
                             if self.quirks.logs_next_update_lr else used_lr)
        values["grad_norm"] = self.grad_norm
        return values

    def _clip(self) -> torch.Tensor:
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else self.quirks.clip_at_when_off
        if max_norm is not None:
            self.precision.unscale(self.optimizer)
            return torch.nn.utils.clip_grad_norm_(self._parameters, max_norm)
        if not self.quirks.norm_of_scaled_gradients_when_clipping_off:
            self.precision.unscale(self.optimizer)
        return torch.nn.utils.get_total_norm([p.grad for p in self._parameters
                                              if p.grad is not None])

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The optimiser, schedule, gradient scaler and (when kept) EMA states."""
        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 "scaler": self.precision.state_dict()}
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self._offload is not None:
            self._offload.to_host()
        self.precision.load_state_dict(state.get("scaler"))
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])

    def rng_state(self, **generators: random.Random | torch.Generator) -> dict[str, Any]:
        """torch's CPU generator (``torch_rng``), the training device's (``cuda_rng``) and each
        of ``generators`` under its name."""
        state: dict[str, Any] = {"torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        for name, generator in generators.items():
            state[name] = (generator.getstate() if isinstance(generator, random.Random)
                           else generator.get_state())
        return state

    def set_rng_state(self, state: Mapping[str, Any],
                      **generators: random.Random | torch.Generator) -> None:
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        for name, generator in generators.items():
            if isinstance(generator, random.Random):
                version, internal, gauss = state[name]
                generator.setstate((version, tuple(internal), gauss))
            else:
                generator.set_state(state[name])
