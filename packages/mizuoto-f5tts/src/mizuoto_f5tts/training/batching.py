"""Batches as upstream f5-tts 1.1.22's trainer feeds them (``model/dataset.py`` + accelerate).

- `MelDataset(clips)`: item ``i`` is ``(mel (100, frames), tokens)``. The audio is read as
  ``torchaudio.load`` reads it, averaged to mono, resampled to 24 kHz like
  ``torchaudio.transforms.Resample`` and turned into F5's log-mel **on one thread**: upstream
  computes it in a data-loader worker, and torch runs workers single-threaded (more threads
  sum the filter bank in another order).
- `frame_batches(durations, frames, max_samples)`: upstream's ``DynamicBatchSampler``: indices
  sorted by ``duration * 24000 / 256`` frames (stable), packed greedily under ``frames`` and
  ``max_samples``; a clip longer than ``frames`` alone is dropped; the remainder is kept.
- `epoch_order(batches, seed)`: the batches shuffled with ``torch.randperm`` from a generator
  seeded with ``seed``. The shuffle seed of epoch ``e`` is `frame_shuffle_seed`.
- ``shuffle=True`` batching is core's `mizuoto.training.loader_order.SampleBatches` (one
  generator seeded once, drawing two ``randperm`` per epoch; the last batch short).
- `collate(items)`: upstream's ``collate_fn``: mels zero-padded to the longest, stacked as
  ``(b, 100, n)``, with lengths and token lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mizuoto.nn.dsp.audio_io import read_audio, to_mono
from mizuoto.nn.dsp.mel import log_mel_spectrogram
from mizuoto.nn.dsp.resample import SincResampler
from mizuoto.runtime.threads import torch_threads
from mizuoto_f5tts.training.data import Clip
from mizuoto_f5tts.variants import HOP_LENGTH, N_FFT, N_MELS, SAMPLE_RATE, WIN_LENGTH


class MelDataset:
    """Mels are computed once and kept while they fit in ``cache_bytes`` (upstream recomputes
    them every epoch; the values are the same)."""

    def __init__(self, clips: Sequence[Clip], cache_bytes: int = 1 << 30) -> None:
        self.clips = list(clips)
        self._resamplers: dict[int, SincResampler] = {}
        self._cache: dict[int, torch.Tensor] = {}
        self._cache_left = cache_bytes

    def __len__(self) -> int:
        return len(self.clips)

    def audio(self, index: int) -> torch.Tensor:
        samples, rate = read_audio(self.clips[index].audio, field="dataset")
        samples = to_mono(samples)
        if rate != SAMPLE_RATE:
            if rate not in self._resamplers:
                self._resamplers[rate] = SincResampler(rate, SAMPLE_RATE)
            samples = self._resamplers[rate](samples)
        return samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, list[str]]:
        mel = self._cache.get(index)
        if mel is None:
            with torch_threads(1):  # upstream's loader worker's
                mel = log_mel_spectrogram(self.audio(index), sample_rate=SAMPLE_RATE,
                                          n_fft=N_FFT, hop_length=HOP_LENGTH,
                                          win_length=WIN_LENGTH, n_mels=N_MELS,
                                          clip_val=1e-5).squeeze(0)
            size = mel.numel() * mel.element_size()
            if size <= self._cache_left:
                self._cache[index] = mel
                self._cache_left -= size
        return mel, list(self.clips[index].tokens)


def frame_batches(durations: Sequence[float], frames: int, max_samples: int = 64
                  ) -> list[list[int]]:
    indexed = sorted(enumerate(d * SAMPLE_RATE / HOP_LENGTH for d in durations),
                     key=lambda item: item[1])
    batches: list[list[int]] = []
    batch: list[int] = []
    batch_frames = 0.0
    for index, frame_len in indexed:
        if batch_frames + frame_len <= frames and (max_samples == 0 or len(batch) < max_samples):
            batch.append(index)
            batch_frames += frame_len
            continue
        if batch:
            batches.append(batch)
        # a clip longer than frames is dropped
        batch, batch_frames = ([index], frame_len) if frame_len <= frames else ([], 0.0)
    if batch:
        batches.append(batch)
    return batches


def frame_shuffle_seed(base_seed: int, epoch: int) -> int:
    # accelerate's loader resets the sampler's epoch to its own count of iterations, and the
    # first epoch runs on skip_first_batches' copy: epochs 0 and 1 both shuffle with the base
    return base_seed + max(epoch - 1, 0)


def epoch_order(batches: Sequence[list[int]], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def collate(items: Sequence[tuple[torch.Tensor, list[str]]]) -> dict:
    mels = [mel for mel, _ in items]
    lengths = torch.LongTensor([mel.shape[-1] for mel in mels])
    longest = lengths.amax()
    padded = torch.stack([F.pad(mel, (0, longest - mel.size(-1)), value=0) for mel in mels])
    return {"mel": padded, "mel_lengths": lengths, "text": [tokens for _, tokens in items]}
