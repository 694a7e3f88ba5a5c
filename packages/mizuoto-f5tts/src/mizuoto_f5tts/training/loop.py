"""The fine-tuning recipe of upstream f5-tts 1.1.22 (``model/trainer.py`` under accelerate):
its loss, data order and position, on core's `mizuoto.training.TrainingRunner` (which runs the
update: accumulation, clipping, fused AdamW, the ``linear`` schedule, the EMA, precision,
DDP and memory levels), drawing random numbers in upstream's order.

Per batch (`flow_matching_loss`, upstream's ``CFM.forward``): span fractions ``uniform_``,
span starts ``rand_like``, noise ``randn_like`` (of the transposed mel, so in its memory
order), times ``rand``, two Python ``random()`` calls (audio drop, then condition drop), then
the backbone's dropout masks. Per epoch, before its first batch: the data loader's worker base
seed (one ``int64`` draw: from torch's global generator with frame batching, from the loader's
generator with sample batching) in epochs 0 and 1 only (the loader of epoch 0 is accelerate's
``skip_first_batches`` copy; the persistent loader draws once, at epoch 1).

An update's micro-batches are accelerate's: every ``grad_accumulation`` batches and at the last
batch of an epoch (the counter restarts there); each loss is still divided by the accumulation
steps. Under torchrun each rank takes every N-th batch of the epoch's order (see `FineTuning`).
The recipe's quirks, declared to the runner (`QUIRKS`): the logged learning rate is the next
update's; with clipping off the norm is of the still-scaled gradients; an update the fp16
scaler skips does not advance the schedule (the EMA and the update count advance anyway).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from mizuoto.training import RecipeQuirks, TrainingRunner
from mizuoto.training.loader_order import SampleBatches
from mizuoto_f5tts.training.batching import (
    MelDataset,
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
    lr_schedule: str = "linear"
    # a LoRA run's adapters (rank, alpha, dropout, module paths); None: full fine-tuning
    lora: dict | None = None


@attrs.define
class Record:
    update: int
    loss: float
    lr: float


QUIRKS = RecipeQuirks(logs_next_update_lr=True, norm_of_scaled_gradients_when_clipping_off=True)


def recomputed_blocks(model: nn.Module) -> list[nn.Module]:
    """The attention and feed-forward blocks ``training.memory`` low recomputes."""
    from mizuoto.nn.transformer.attention import Attention
    from mizuoto.nn.transformer.feedforward import FeedForward

    return [m for m in model.modules() if isinstance(m, (Attention, FeedForward))]


class FineTuning:
    """One run's data, loss and position on ``runner``; `next_update` trains one update."""

    def __init__(self, model: nn.Module, vocab: Mapping[str, int], dataset: MelDataset,
                 durations: Sequence[float], settings: LoopSettings, *,
                 py_random: random.Random, runner: TrainingRunner,
                 shard_batches: bool = True, keep_ema: bool = True) -> None:
        self.model = model
        self.runner = runner
        # multi-process (DDP): rank r takes batches r, r + N, ... of every epoch's order,
        # wrapping around so that all ranks make the same number of updates; with
        # shard_batches=False every rank trains on every batch (a check: then the weights
        # equal a single process's)
        self.rank, self.world_size = runner.world.rank, runner.world.size
        self.shard = shard_batches and self.world_size > 1
        self.vocab = vocab
        self.dataset = dataset
        self.settings = settings
        self.draws = py_random
        if keep_ema:  # a LoRA run exports its adapters as trained: no copy of the model
            runner.keep_ema(model)
        runner.checkpoint_activations(recomputed_blocks(model))
        # after the EMA copy: DDP hooks stay on the trained model only
        self.backbone = runner.wrap(model.transformer, find_unused_parameters=True)
        self.device = runner.device
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
        runner.optimize(model, learning_rate=settings.learning_rate,
                        schedule=settings.lr_schedule, warmup=settings.warmup_updates,
                        total=self.total_updates, fused=True,
                        parameters=[p for p in model.parameters() if p.requires_grad])
        self.epoch = 0
        self.index = 0  # next batch of the epoch
        self.update = 0
        self.accumulated = 0  # accelerate's step counter
        self.order: list[list[int]] = []
        self.records: list[Record] = []

    @property
    def ema(self):
        return self.runner.ema

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

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.index == 0:
            self._start_epoch()
        batch = collate([self.dataset[i] for i in self.order[self.index]])
        # accelerate's counter: it restarts at an epoch's last batch
        last = self.index == len(self.order) - 1
        self.accumulated = 0 if last else self.accumulated + 1
        self.index += 1
        if self.index == len(self.order):
            self.epoch += 1
            self.index = 0
        device = self.device
        return (batch["mel"].to(device).permute(0, 2, 1),
                text_ids(batch["text"], self.vocab).to(device), batch["mel_lengths"].to(device))

    # -- one update -----------------------------------------------------------------------

    def next_update(self) -> dict[str, float]:
        """Train the micro-batches of the next optimiser update; its logged values (the last
        micro-batch's loss, the learning rate after the schedule's step, the gradient norm
        before clipping). Every micro-batch is recorded, as upstream logs it."""
        every = self.settings.grad_accumulation
        count = min(every - self.accumulated % every, self.batches_per_epoch - self.index)
        losses: list[float] = []
        lr, update = self.runner.scheduler.get_last_lr()[0], self.update

        def loss(batch):
            mel, text, lens = batch
            # accelerate converts a prepared model's outputs to float32
            value = flow_matching_loss(self.backbone, mel, text, lens, self.draws).float()
            losses.append(value)
            return {"loss": value}

        values = self.runner.update(self._next_batch, loss, micro_batches_count=count)
        self.update += 1
        self.records += [Record(update, value.item(), lr) for value in losses[:-1]]
        self.records.append(Record(self.update, values["loss"], values["lr"]))
        return values

    # -- checkpoint state -----------------------------------------------------------------

    def rng_state(self) -> dict:
        return self.runner.rng_state(python_rng=self.draws)

    def set_rng_state(self, state: Mapping) -> None:
        self.runner.set_rng_state(state, python_rng=self.draws)

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            **self.runner.state_dict(),  # optimizer, scheduler, scaler, ema
            **self.rng_state(),
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
        # the recipe of runs from before these settings
        for name, default in (("mixed_precision", "no"), ("lr_schedule", "linear"),
                              ("lora", None)):
            if recipe[name] == default:
                recipe.pop(name)
        recipe.update(world_size=self.world_size, shard=self.shard)
        return recipe

    def load_state_dict(self, state: Mapping) -> None:
        self.model.load_state_dict(state["model"])
        self.runner.load_state_dict(state)
        self.set_rng_state(state)
        if self.sampler is not None:
            self.sampler.generator.set_state(state["sampler_rng"])
        position = state["position"]
        self.epoch, self.index = position["epoch"], position["index"]
        self.update, self.accumulated = position["update"], position["accumulated"]
        self.order = [list(b) for b in state["order"]]
        self.records = [Record(*r) for r in state["records"]]
