"""The feature toy's engine: the example's hummer with a timbre, batches and LoRA adapters."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto.plugin import SupportsBatching, SupportsLoRA, save_safetensors
from mizuoto_example.engine import ToyEngine
from toy_features import ENGINE, LANGUAGES, FeatureOptions, FeatureParams

LORA_FILE = "lora.safetensors"
#: requests arriving within this long of the previous one join its batch
ADMISSION_SECONDS = 0.05


class FeatureToy(ToyEngine, SupportsBatching, SupportsLoRA):
    name = ENGINE
    params_class = FeatureParams
    options_class = FeatureOptions
    concurrent_requests = True  # every request's state is its own (its generator, its text)
    # its own toy LoRA (a level delta file, below), not the example's declared adapters
    lora_targets = None

    # the example's level table is a linear layer's weight (mizuoto_example.engine._Tables):
    # the toy LoRA adds to it as a plain tensor of levels
    @property
    def _level(self) -> torch.Tensor:
        return self._tables.level.weight.detach().view(-1).clone()

    @_level.setter
    def _level(self, value: torch.Tensor) -> None:
        with torch.no_grad():
            self._tables.level.weight.copy_(value.view(1, -1))

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        engine = super().load(model_dir, options=options, model_id=model_id, progress=progress)
        engine._info = attrs.evolve(engine._info, languages=LANGUAGES)
        engine._base_level, engine._lora = engine._level, None
        engine._batch = _Admission(engine._options.max_batch)
        return engine

    # -- a timbre -----------------------------------------------------------------------

    def _hum(self, text, params, shape, generator, progress):
        for piece in super()._hum(text, params, shape, generator, progress):
            if params.timbre == "soft":
                piece = attrs.evolve(piece, audio=attrs.evolve(
                    piece.audio, samples=piece.audio.samples.clamp(-0.05, 0.05)))
            yield piece

    # -- batching -----------------------------------------------------------------------

    @classmethod
    def batch_options(cls, section, max_batch):
        return {"max_batch": max_batch, **section}

    @property
    def max_batch(self) -> int:
        return self._options.max_batch

    @property
    def batch_stats(self):
        return None

    def _stream(self, request, params, generator, progress):
        if self.max_batch > 1:
            generator = self._row_generator(self._batch.admit(request.seed), generator)
        return super()._stream(request, params, generator, progress)

    def _row_generator(self, batch: list[int], generator: torch.Generator) -> torch.Generator:
        """The generator a row of ``batch`` (its seeds) draws from: its own."""
        return generator

    # -- LoRA ---------------------------------------------------------------------------

    @property
    def lora(self):
        return self._lora

    def set_lora(self, path) -> None:
        if path is None:
            self._level, self._lora = self._base_level, None
            return
        self._level = self._base_level + read_lora(path, self._base_level.shape)
        self._lora = str(path)


def read_lora(path, shape) -> torch.Tensor:
    file = Path(path) / LORA_FILE
    if not file.is_file():
        raise ModelFilesMissing(str(path), [LORA_FILE], "a toy LoRA directory holds it")
    delta = load_file(str(file))["level_delta"].to(torch.float64)
    if tuple(delta.shape) != tuple(shape):
        raise CheckpointMismatch(str(file), detail=f"level_delta is {tuple(delta.shape)}, the "
                                                   f"model's levels {tuple(shape)}")
    return delta


def write_lora(model_dir, lora_dir, seed) -> None:
    """A toy LoRA for the model in ``model_dir``: seeded level changes, zeros for seed None."""
    levels = load_file(str(Path(model_dir) / "model.safetensors"))["level"]
    delta = (torch.zeros_like(levels) if seed is None else
             0.05 * torch.randn(levels.shape, generator=torch.Generator().manual_seed(seed)))
    Path(lora_dir).mkdir(parents=True, exist_ok=True)
    save_safetensors({"level_delta": delta.contiguous()}, Path(lora_dir) / LORA_FILE)


class _Admission:
    """Requests arriving together form a batch: each waits until none has arrived for
    ADMISSION_SECONDS (or the batch is full), and learns the seeds of its batch."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._guard = threading.Condition()
        self._open: list[int] = []
        self._last = 0.0

    def admit(self, seed: int) -> list[int]:
        with self._guard:
            self._open.append(seed)
            self._last = time.monotonic()
            batch = self._open
            while batch is self._open and len(batch) < self.size:
                quiet = self._last + ADMISSION_SECONDS - time.monotonic()
                if quiet <= 0:
                    break
                self._guard.wait(quiet)
            if batch is self._open:
                self._open = []
                self._guard.notify_all()
            return sorted(batch)
