"""The fine-tuning loop of upstream f5-tts 1.1.22 (``model/trainer.py`` under accelerate, one
process), without accelerate or ema_pytorch, drawing random numbers in upstream's order.

Per batch (`flow_matching_loss`, upstream's ``CFM.forward``): span fractions ``uniform_``,
span starts ``rand_like``, noise ``randn_like`` (of the transposed mel, so in its memory
order), times ``rand``, two Python ``random()`` calls (audio drop, then condition drop), then
the backbone's dropout masks. Per epoch, before its first batch: the data loader's worker base
seed (one ``int64`` draw: from torch's global generator with frame batching, from the loader's
generator with sample batching) in epochs 0 and 1 only (the loader of epoch 0 is accelerate's
``skip_first_batches`` copy; the persistent loader draws once, at epoch 1).

Updates follow accelerate's gradient accumulation: the loss is divided by the accumulation
steps; an update happens every ``grad_accumulation`` batches and at the last batch of an epoch
(the counter restarts there); clipping (``clip_grad_norm_``), fused AdamW, the warm-up + linear
decay schedule (``SequentialLR`` of two ``LinearLR``: 1e-8 -> 1 over the warm-up, 1 -> 1e-8 over
the rest of ``ceil(batches / accumulation) * epochs``) and `EMA` step only then.

Under torchrun the backbone is wrapped in ``DistributedDataParallel`` and each rank takes every
N-th batch of the epoch's order (see `FineTuning`); ``training.memory`` other than ``default``
recomputes activations (`checkpoint_activations`) and keeps the EMA copy on the CPU; ``lowest``
also keeps AdamW's state there between updates (`OptimizerStateOffload`).

The loop runs where the model is (``compute.device``). ``mixed_precision`` is accelerate's:
``bf16``/``fp16`` run the loss (upstream's whole ``CFM.forward``) under ``torch.autocast``;
``fp16`` adds its ``GradScaler``: the scaled loss is backpropagated, gradients are unscaled
before clipping, and an update the scaler skips does not advance the schedule (the EMA and the
update count advance anyway, as upstream's loop does) (core's `mizuoto.training.Precision`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.optim import AdamW
from torch.optim.lr_scheduler import LinearLR, SequentialLR

from mizuoto.training import Precision
from mizuoto_f5tts.training.batching import (
    MelDataset,
    SampleBatches,
    collate,
    epoch_order,
    frame_batches,
    frame_shuffle_seed,
)

AUDIO_DROP_PROB = 0.3
COND_DROP_PROB = 0.2
FRAC_LENGTHS_MASK = (0.7, 1.0)


def text_ids(tokens: Sequence[Sequence[str]], vocab: Mapping[str, int]) -> torch.Tensor:
    """Upstream's ``list_str_to_idx``: ids per item (unknown -> 0), padded with -1."""
    rows = [torch.tensor([vocab.get(token, 0) for token in item]) for item in tokens]
    return pad_sequence(rows, padding_value=-1, batch_first=True)


def flow_matching_loss(backbone: Callable[..., torch.Tensor], mel: torch.Tensor,
                       text: torch.Tensor, lens: torch.Tensor, draws: random.Random
                       ) -> torch.Tensor:
    """Masked flow-matching MSE of ``backbone`` (a DiT/UNetT, or its DDP wrapper) on ``mel``
    ``(b, n, channels)``."""
    batch, seq_len, dtype, device = mel.shape[0], mel.shape[1], mel.dtype, mel.device
    mask = torch.arange(seq_len, device=device)[None, :] < lens[:, None]

    frac_lengths = torch.zeros((batch,), device=device).float().uniform_(*FRAC_LENGTHS_MASK)
    lengths = (frac_lengths * lens).long()
    start = ((lens - lengths) * torch.rand_like(frac_lengths)).long().clamp(min=0)
    end = start + lengths
    seq = torch.arange(lens.max().item(), device=device).long()
    span = (seq[None, :] >= start[:, None]) & (seq[None, :] < end[:, None])
    span &= mask

    x1 = mel
    x0 = torch.randn_like(x1)
    time = torch.rand((batch,), dtype=dtype, device=device)
    t = time.unsqueeze(-1).unsqueeze(-1)
    noisy = (1 - t) * x0 + t * x1
    flow = x1 - x0
    cond = torch.where(span[..., None], torch.zeros_like(x1), x1)

    drop_audio_cond = draws.random() < AUDIO_DROP_PROB
    drop_text = draws.random() < COND_DROP_PROB
    drop_audio_cond = drop_audio_cond or drop_text
    pred = backbone(x=noisy, cond=cond, text=text, time=time,
                    drop_audio_cond=drop_audio_cond, drop_text=drop_text, mask=mask)
    loss = F.mse_loss(pred, flow, reduction="none")
    return loss[span].mean()


class EMA:
    """ema_pytorch 0.8.3's ``EMA`` with its defaults (beta 0.9999, update every 10 steps,
    copy until step 100, then decay ``1 - (1 + epoch) ** -2/3``). ``state_dict`` has upstream's
    keys: ``initted``, ``step``, ``ema_model.<key>``."""

    beta, update_after_step, update_every, inv_gamma, power, min_value = (
        0.9999, 100, 10, 1.0, 2 / 3, 0.0)

    def __init__(self, model: nn.Module, device: str | torch.device | None = None) -> None:
        self.ema_model = copy.deepcopy(model)
        if device is not None:
            self.ema_model.to(device)
        for p in self.ema_model.parameters():
            p.detach_()
        self.initted = torch.tensor(False)
        self.step = torch.tensor(0)

    def _pairs(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        params = [(e, c) for (_, e), (_, c) in zip(self.ema_model.named_parameters(),
                                                 model.named_parameters(), strict=True)
                  if e.is_floating_point()]
        buffers = [(e, c) for (_, e), (_, c) in zip(self.ema_model.named_buffers(),
                                                  model.named_buffers(), strict=True)
                   if e.is_floating_point()]
        return params + buffers

    def _copy(self, model: nn.Module) -> None:
        for ema, current in self._pairs(model):
            ema.data.copy_(current.data)

    def current_decay(self) -> float:
        epoch = (self.step - self.update_after_step - 1).clamp(min=0.0)
        value = 1 - (1 + epoch / self.inv_gamma) ** -self.power
        if epoch.item() <= 0:
            return 0.0
        return value.clamp(min=self.min_value, max=self.beta).item()

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        step = self.step.item()
        self.step += 1
        if not self.initted.item():
            self._copy(model)
            self.initted.data.copy_(torch.tensor(True))
            return
        if step % self.update_every != 0:
            return
        if step <= self.update_after_step:
            self._copy(model)
            return
        weight = 1.0 - self.current_decay()
        for ema, current in self._pairs(model):
            ema.data.lerp_(current.data.to(ema.device), weight)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {"initted": self.initted.clone(), "step": self.step.clone()}
        state.update({f"ema_model.{k}": v for k, v in self.ema_model.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.initted = state["initted"].clone()
        self.step = state["step"].clone()
        self.ema_model.load_state_dict(
            {k.removeprefix("ema_model."): v for k, v in state.items()
             if k.startswith("ema_model.")})


@attrs.frozen
class LoopSettings:
    epochs: int
    learning_rate: float
    warmup_updates: int
    batch_size_type: str = "frame"
    batch_size: int = 3200
    max_samples: int = 64
    grad_accumulation: int = 1
    max_grad_norm: float = 1.0
    shuffle_seed: int = 666
    save_every: int = 500
    max_updates: int | None = None
    mixed_precision: str = "no"


@attrs.define
class Record:
    update: int
    loss: float
    lr: float


def checkpoint_activations(model: nn.Module) -> int:
    """Recompute each attention and feed-forward block in the backward pass instead of keeping
    its activations (``torch.utils.checkpoint``, non-reentrant). The RNG state is replayed for
    the dropout masks and restored after, so every value and gradient keeps its bytes.
    Returns the number of wrapped modules."""
    from torch.utils.checkpoint import checkpoint

    from mizuoto.nn.transformer.attention import Attention
    from mizuoto.nn.transformer.feedforward import FeedForward

    wrapped = 0
    for module in model.modules():
        if isinstance(module, (Attention, FeedForward)):
            forward = module.forward

            def recomputed(*args, _forward=forward, **kwargs):
                if not torch.is_grad_enabled():
                    return _forward(*args, **kwargs)
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

            module.forward = recomputed
            wrapped += 1
    return wrapped


class OptimizerStateOffload:
    """AdamW's moments in host memory between updates, on the device only for the step
    (``training.memory = "lowest"`` on a GPU): the step's kernel and bytes are unchanged.
    A no-op when the model is on the CPU."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self.active = device.type != "cpu"

    def _move(self, device: torch.device | str) -> None:
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device)

    def to_device(self) -> None:
        if self.active:
            self._move(self.device)

    def to_host(self) -> None:
        if self.active:
            self._move("cpu")


class FineTuning:
    """One run: model, EMA, optimiser, schedule, batch order and position; `run` trains."""

    def __init__(self, model: nn.Module, vocab: Mapping[str, int], dataset: MelDataset,
                 durations: Sequence[float], settings: LoopSettings, *,
                 py_random: random.Random, memory: str = "default",
                 world: tuple[int, int] = (0, 1), shard_batches: bool = True) -> None:
        self.model = model
        self.grad_norm = 0.0  # the last update's, before clipping
        # multi-process (DDP): rank r takes batches r, r + N, ... of every epoch's order,
        # wrapping around so that all ranks make the same number of updates; with
        # shard_batches=False every rank trains on every batch (a check: then the weights
        # equal a single process's)
        self.rank, self.world_size = world
        self.shard = shard_batches and self.world_size > 1

        self.vocab = vocab
        self.dataset = dataset
        self.settings = settings
        self.draws = py_random
        # training.memory: "low" recomputes block activations and keeps the EMA copy in CPU
        # RAM; "lowest" also keeps AdamW's moments there (on a CPU run: the same bytes)
        self.memory = memory
        self.ema = EMA(model, device="cpu" if memory != "default" else None)
        if memory != "default":
            checkpoint_activations(model)
        self.backbone = model.transformer
        if self.world_size > 1:  # after the EMA copy: DDP hooks stay on the trained model only
            from torch.nn.parallel import DistributedDataParallel

            self.backbone = DistributedDataParallel(model.transformer,
                                                    find_unused_parameters=True)
        self.optimizer = AdamW(model.parameters(), lr=settings.learning_rate, fused=True)
        self.device = next(model.parameters()).device
        # core's Precision: accelerate's autocast and (fp16) gradient scaler, as one object
        self.precision = Precision(settings.mixed_precision, str(self.device))
        self.offload = OptimizerStateOffload(self.optimizer, self.device) \
            if memory == "lowest" else None
        if settings.batch_size_type == "frame":
            self.batches = frame_batches(durations, settings.batch_size, settings.max_samples)
            self.sampler = None
            per_epoch = len(self.batches)
        else:
            self.batches = []
            self.sampler = SampleBatches(len(dataset), settings.batch_size, settings.shuffle_seed)
            per_epoch = len(self.sampler)
        if per_epoch == 0:
            raise ValueError("no batch fits: every clip is longer than the frames per batch")
        if self.shard:
            per_epoch = -(-per_epoch // self.world_size)
        self.batches_per_epoch = per_epoch
        self.total_updates = math.ceil(per_epoch / settings.grad_accumulation) * settings.epochs
        warmup = settings.warmup_updates
        self.scheduler = SequentialLR(self.optimizer, schedulers=[
            LinearLR(self.optimizer, start_factor=1e-8, end_factor=1.0, total_iters=warmup),
            LinearLR(self.optimizer, start_factor=1.0, end_factor=1e-8,
                     total_iters=self.total_updates - warmup),
        ], milestones=[warmup])
        self.epoch = 0
        self.index = 0  # next batch of the epoch
        self.update = 0
        self.accumulated = 0  # accelerate's step counter
        self.order: list[list[int]] = []
        self.records: list[Record] = []

    # -- position -------------------------------------------------------------------------

    def _start_epoch(self) -> None:
        self.model.train()
        if self.sampler is None:
            if self.epoch <= 1:
                torch.empty((), dtype=torch.int64).random_()
            self.order = epoch_order(self.batches,
                                     frame_shuffle_seed(self.settings.shuffle_seed, self.epoch))
        else:
            if self.epoch <= 1:
                self.sampler.draw_worker_seed()
            self.order = self.sampler.epoch()
        if self.shard:
            count = len(self.order)
            self.order = [self.order[(self.rank + i * self.world_size) % count]
                          for i in range(self.batches_per_epoch)]

    def done(self) -> bool:
        limit = self.settings.max_updates
        return self.epoch >= self.settings.epochs or (limit is not None and self.update >= limit)

    # -- one batch ------------------------------------------------------------------------

    def _step(self, indices: list[int]) -> Record | None:
        batch = collate([self.dataset[i] for i in indices])
        device = self.device
        mel = batch["mel"].to(device).permute(0, 2, 1)
        lens = batch["mel_lengths"].to(device)
        text = text_ids(batch["text"], self.vocab).to(device)

        last = self.index == len(self.order) - 1
        if last:
            self.accumulated = 0
            sync = True
        else:
            self.accumulated += 1
            sync = self.accumulated % self.settings.grad_accumulation == 0

        skip_sync = contextlib.nullcontext()
        if self.world_size > 1 and not sync:
            skip_sync = self.backbone.no_sync()  # gradients all-reduced at the update only
        with skip_sync:
            with self.precision.autocast():
                # accelerate converts a prepared model's outputs to float32
                loss = flow_matching_loss(self.backbone, mel, text, lens, self.draws).float()
            self.precision.backward(loss / self.settings.grad_accumulation)
        if sync:
            if self.settings.max_grad_norm > 0:
                self.precision.unscale(self.optimizer)
                self.grad_norm = float(torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.settings.max_grad_norm))
            else:  # upstream does not clip then (nor unscale): the norm is still logged
                self.grad_norm = float(torch.nn.utils.get_total_norm(
                    [p.grad for p in self.model.parameters() if p.grad is not None]))
            if self.offload is not None:
                self.offload.to_device()
            if self.precision.step(self.optimizer):
                self.scheduler.step()
            if self.offload is not None:
                self.offload.to_host()
            self.optimizer.zero_grad(set_to_none=True)
            self.ema.update(self.model)
            self.update += 1
        record = Record(self.update, loss.item(), self.scheduler.get_last_lr()[0])
        self.records.append(record)
        return record if sync else None

    def next_update(self) -> dict[str, float]:
        """Train micro-batches up to the next optimiser update; its logged values (the last
        micro-batch's loss, the learning rate after the schedule's step, the gradient norm
        before clipping)."""
        while True:
            if self.index == 0:
                self._start_epoch()
            record = self._step(self.order[self.index])
            self.index += 1
            if self.index == len(self.order):
                self.epoch += 1
                self.index = 0
            if record is not None:
                return {"loss": record.loss, "lr": record.lr, "grad_norm": self.grad_norm}

    # -- checkpoint state -----------------------------------------------------------------

    def rng_state(self) -> dict:
        state = {"torch_rng": torch.get_rng_state(), "python_rng": self.draws.getstate()}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def set_rng_state(self, state: Mapping) -> None:
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        version, internal, gauss = state["python_rng"]
        self.draws.setstate((version, tuple(internal), gauss))

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            **self.rng_state(),
            "scaler": self.precision.state_dict(),
            "sampler_rng": None if self.sampler is None else self.sampler.generator.get_state(),
            "position": {"epoch": self.epoch, "index": self.index, "update": self.update,
                         "accumulated": self.accumulated},
            "order": self.order,
            "records": [attrs.astuple(r) for r in self.records],
            "settings": self.recipe(),
        }

    def recipe(self) -> dict:
        """What a resumed run must share with the one it resumes (not its length or saves)."""
        recipe = attrs.asdict(self.settings)
        for free in ("max_updates", "save_every"):
            recipe.pop(free)
        if recipe["mixed_precision"] == "no":  # the recipe of runs from before the setting
            recipe.pop("mixed_precision")
        recipe.update(world_size=self.world_size, shard=self.shard)
        return recipe

    def load_state_dict(self, state: Mapping) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.offload is not None:
            self.offload.to_host()
        self.precision.load_state_dict(state.get("scaler"))
        self.scheduler.load_state_dict(state["scheduler"])
        self.set_rng_state(state)
        if self.sampler is not None:
            self.sampler.generator.set_state(state["sampler_rng"])
        position = state["position"]
        self.epoch, self.index = position["epoch"], position["index"]
        self.update, self.accumulated = position["update"], position["accumulated"]
        self.order = [list(b) for b in state["order"]]
        self.records = [Record(*r) for r in state["records"]]
