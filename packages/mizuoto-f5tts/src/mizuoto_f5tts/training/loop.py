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

Micro-batches, updates and torchrun's shares of an epoch are accelerate's (core's
`EpochPosition`); each loss is divided by the accumulation steps, even in an epoch's short update.
The recipe's quirks, declared to the runner (`QUIRKS`): the logged learning rate is the next
update's; with clipping off the norm is of the still-scaled gradients; an update the fp16
scaler skips does not advance the schedule (the EMA and the update count advance anyway).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from mizuoto.nn.transformer.attention import Attention
from mizuoto.nn.transformer.feedforward import FeedForward
from mizuoto.training import EpochPosition, RecipeQuirks, RunnerSession, TrainingRunner
from mizuoto.training.loader_order import SampleBatches, draw_seed
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
    mixed_precision: str = "no"
    lr_schedule: str = "linear"
    # a LoRA run's adapters (rank, alpha, dropout, module paths); None: full fine-tuning
    lora: dict | None = None
    steps: int | None = None  # config.steps: the run stops there, the schedule does not


QUIRKS = RecipeQuirks(logs_next_update_lr=True, norm_of_scaled_gradients_when_clipping_off=True)
LOG_FILE = "training_log.jsonl"


class FineTuning(RunnerSession):
    """One run's data and loss on ``runner``; core's `RunnerSession` keeps the checkpoint, the
    position in the epochs, every process's generators and ``log`` (`LOG_FILE`: every
    micro-batch as upstream logs it). ``session``: `RunnerSession`'s samples keywords."""

    def __init__(self, model: nn.Module, vocab: Mapping[str, int], dataset: MelDataset,
                 durations: Sequence[float], settings: LoopSettings, *,
                 py_random: random.Random, runner: TrainingRunner, log: Path | None = None,
                 shard_batches: bool = True, keep_ema: bool = True, **session) -> None:
        self.vocab, self.dataset, self.settings, self.draws = vocab, dataset, settings, py_random
        if keep_ema:  # a LoRA run exports its adapters as trained: no copy of the model
            runner.keep_ema(model)
        # training.memory low recomputes the attention and feed-forward blocks
        runner.checkpoint_activations(m for m in model.modules()
                                      if isinstance(m, (Attention, FeedForward)))
        # after the EMA copy: DDP hooks stay on the trained model only
        self.backbone = runner.wrap(model.transformer, find_unused_parameters=True)
        generators: dict = {"python_rng": py_random}
        if settings.batch_size_type == "frame":
            self.batches = frame_batches(durations, settings.batch_size, settings.max_samples)
            self.sampler, count = None, len(self.batches)
        else:
            self.sampler = SampleBatches(len(dataset), settings.batch_size, settings.shuffle_seed)
            generators["sampler_rng"], count = self.sampler.generator, len(self.sampler)
        # under torchrun rank r takes batches r, r + N, ... (shard_batches=False: every rank
        # every batch, a check that the weights then equal a single process's)
        position = EpochPosition(count, epochs=settings.epochs, new_order=self._epoch_order,
                                 grad_accumulation=settings.grad_accumulation,
                                 world=runner.world, shard=shard_batches,
                                 max_updates=settings.steps)
        runner.optimize(model, learning_rate=settings.learning_rate,
                        schedule=settings.lr_schedule, warmup=settings.warmup_updates,
                        total=position.schedule_updates, fused=True)
        recipe = {k: v for k, v in attrs.asdict(settings).items()
                  if k not in ("steps", "save_every")}  # a resume may change these
        super().__init__(runner, model, total=position.total_updates,
                         next_batch=self._next_batch, loss=self._loss, generators=generators,
                         position=position, batch_log=log, **session, recipe={
                             **recipe, "world_size": runner.world.size, "shard": position.shard})

    def _epoch_order(self, epoch: int) -> list[list[int]]:
        self.model.train()
        if epoch <= 1:  # the loader's worker base seed: torch's generator under frame batching
            draw_seed(None if self.sampler is None else self.sampler.generator)
        if self.sampler is None:
            return epoch_order(self.batches, frame_shuffle_seed(self.settings.shuffle_seed, epoch))
        return self.sampler.epoch()

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = collate([self.dataset[i] for i in self.position.next_batch()])
        device = self.runner.device
        return (batch["mel"].to(device).permute(0, 2, 1),
                text_ids(batch["text"], self.vocab).to(device), batch["mel_lengths"].to(device))

    def _loss(self, batch) -> dict[str, torch.Tensor]:
        # accelerate converts a prepared model's outputs to float32
        return {"loss": flow_matching_loss(self.backbone, *batch, self.draws).float()}
