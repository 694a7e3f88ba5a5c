"""Integer PCM with pydub's semantics, and pydub's silence detection on it.

Upstream F5-TTS prepares references (and optionally its output) with pydub, whose
``AudioSegment`` counts time in rounded milliseconds, pads slices up to 2 ms with zeros,
measures loudness with ``audioop.rms`` (a truncated integer), converts rates with
``audioop.ratecv`` and joins segments by first converting both to the larger channel count,
rate and sample width. :class:`PcmSegment` does the same on numpy integers, and
:func:`split_on_silence` / :func:`leading_silence_ms` are pydub.silence's functions on it, so
every decision (where to cut, how many samples) comes out as pydub's.
"""

from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
import torch

from mizuoto.errors import InvalidAudio

# pydub.AudioSegment.silent's default rate: concatenating with it resamples slower audio up.
SILENT_RATE = 11025




@attrs.frozen(eq=False)
class PcmSegment:
    """Integer PCM samples ``[frames, channels]`` as pydub's AudioSegment holds them."""

    samples: np.ndarray  # int64
    rate: int
    width: int  # bytes per sample

    @classmethod
    def silent(cls, duration_ms: int) -> PcmSegment:
        frames = int(SILENT_RATE * (duration_ms / 1000.0))
        return cls(np.zeros((frames, 1), dtype=np.int64), SILENT_RATE, 2)

    @property
    def frames(self) -> int:
        return int(self.samples.shape[0])

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    def __len__(self) -> int:
        """Length in milliseconds, rounded (half to even) as pydub rounds it."""
        return round(1000 * (self.frames / self.rate))

    def _frame(self, ms: float) -> int:
        if ms < 0:
            ms = len(self) - abs(ms)
        return int(ms * (self.rate / 1000.0))

    def _span(self, start_ms: int | None, end_ms: int | None) -> tuple[int, int, int]:
        """Frame range of a pydub slice, and how many zero frames pydub appends to it."""
        length = len(self)
        start = min(0 if start_ms is None else start_ms, length)
        end = min(length if end_ms is None else end_ms, length)
        first, stop = self._frame(start), self._frame(end)
        taken = max(0, min(stop, self.frames) - first) if first < self.frames else 0
        missing = (stop - first) - taken
        if missing > 0 and taken == 0:
            missing = 0  # pydub pads with copies of an (absent) first frame: nothing
        if missing > 2 * (self.rate / 1000.0):
            raise InvalidAudio("reference.audio", "cannot be sliced as pydub slices it")
        return first, first + taken, max(missing, 0)

    def slice(self, start_ms: int | None = None, end_ms: int | None = None) -> PcmSegment:
        """``segment[start_ms:end_ms]``; a slice ending past the last frame gets zero frames,
        as pydub pads slices that its rounded millisecond length makes too long."""
        first, stop, missing = self._span(start_ms, end_ms)
        samples = self.samples[first:stop]
        if missing:
            samples = np.concatenate([samples, np.zeros((missing, self.channels), np.int64)])
        return attrs.evolve(self, samples=samples)

    def reverse(self) -> PcmSegment:
        return attrs.evolve(self, samples=self.samples[::-1])

    @property
    def max_amplitude(self) -> float:
        return (2 ** (self.width * 8)) / 2

    def rms_of(self, start_ms: int, end_ms: int, prefix: np.ndarray | None = None) -> int:
        """``audioop.rms`` of ``segment[start_ms:end_ms]``: a truncated integer.

        ``prefix`` (cumulative sums of squares, for widths up to 2 bytes) makes it O(1); the
        sums are exact integers, as audioop's double accumulation of them is.
        """
        first, stop, missing = self._span(start_ms, end_ms)
        count = (stop - first + missing) * self.channels
        if count == 0:
            return 0
        if prefix is not None:
            total = float(prefix[stop] - prefix[first])
        else:
            # audioop squares each sample in double and adds them in order
            squares = self.samples[first:stop].astype(np.float64).reshape(-1) ** 2
            total = float(np.cumsum(squares)[-1]) if squares.size else 0.0
        return int(math.sqrt(total / float(count)))

    def square_prefix(self) -> np.ndarray | None:
        if self.width > 2:
            return None
        per_frame = (self.samples * self.samples).sum(axis=1)
        return np.concatenate([[0], np.cumsum(per_frame)])

    def dbfs_of(self, start_ms: int, end_ms: int, prefix: np.ndarray | None = None) -> float:
        rms = self.rms_of(start_ms, end_ms, prefix)
        if not rms:
            return -math.inf
        # pydub's ratio_to_db uses log(ratio, 10), which is not always log10(ratio)
        return 20 * math.log(rms / self.max_amplitude, 10)

    # conversions pydub applies when joining segments (AudioSegment._sync)

    def with_channels(self, channels: int) -> PcmSegment:
        if channels == self.channels:
            return self
        if self.channels != 1:
            raise ValueError("only mono segments are widened")
        return attrs.evolve(self, samples=np.repeat(self.samples, channels, axis=1))

    def with_rate(self, rate: int) -> PcmSegment:
        if rate == self.rate or self.frames == 0:
            return attrs.evolve(self, rate=rate)
        return attrs.evolve(self, samples=ratecv(self.samples, self.width, self.rate, rate),
                            rate=rate)

    def with_width(self, width: int) -> PcmSegment:
        if width == self.width:
            return self
        shift = 8 * (width - self.width)
        samples = self.samples << shift if shift > 0 else self.samples >> -shift
        return attrs.evolve(self, samples=samples, width=width)

    def __add__(self, other: PcmSegment) -> PcmSegment:
        channels = max(self.channels, other.channels)
        rate = max(self.rate, other.rate)
        width = max(self.width, other.width)
        a, b = (s.with_channels(channels).with_rate(rate).with_width(width) for s in (self, other))
        return PcmSegment(np.concatenate([a.samples, b.samples]), rate, width)

    def to_float(self) -> torch.Tensor:
        """``[channels, frames]`` float32, as torchaudio reads the PCM WAV pydub writes."""
        scale = float(2 ** (8 * self.width - 1))
        return torch.from_numpy(np.ascontiguousarray(self.samples.T, dtype=np.float32)) / scale


def ratecv(samples: np.ndarray, width: int, in_rate: int, out_rate: int) -> np.ndarray:
    """``audioop.ratecv`` with its defaults (no filter state, weights 1 and 0).

    Output frame ``j`` interpolates linearly between input frames ``k - 1`` and ``k``,
    ``k = ceil(j * in / out)``, in double, truncated toward zero, on samples scaled to 32 bits.
    There are ``(frames - 1) * out // in + 1`` output frames (not ``frames * out / in``).
    """
    divisor = math.gcd(in_rate, out_rate)
    in_step, out_step = in_rate // divisor, out_rate // divisor
    frames = samples.shape[0]
    count = (frames - 1) * out_step // in_step + 1
    j = np.arange(count, dtype=np.int64)
    k = (j * in_step + out_step - 1) // out_step
    d = (k * out_step - j * in_step).astype(np.float64)[:, None]
    shift = 32 - 8 * width
    wide = samples << shift
    current = wide[k].astype(np.float64)
    previous = np.where((k > 0)[:, None], wide[np.maximum(k - 1, 0)], 0).astype(np.float64)
    mixed = np.trunc((previous * d + current * (out_step - d)) / out_step).astype(np.int64)
    return mixed >> shift




def detect_silence(segment: PcmSegment, min_silence_ms: int, threshold_dbfs: float,
                    seek_ms: int) -> list[list[int]]:
    length = len(segment)
    if length < min_silence_ms:
        return []
    threshold = 10 ** (float(threshold_dbfs) / 20) * segment.max_amplitude
    last_start = length - min_silence_ms
    starts = range(0, last_start + 1, seek_ms)
    if last_start % seek_ms:
        starts = itertools.chain(starts, [last_start])
    prefix = segment.square_prefix()
    silent_starts = [i for i in starts
                     if segment.rms_of(i, i + min_silence_ms, prefix) <= threshold]
    if not silent_starts:
        return []
    ranges = []
    range_start = previous = silent_starts[0]
    for start in silent_starts[1:]:
        continuous = start == previous + seek_ms
        has_gap = start > previous + min_silence_ms
        if not continuous and has_gap:
            ranges.append([range_start, previous + min_silence_ms])
            range_start = start
        previous = start
    ranges.append([range_start, previous + min_silence_ms])
    return ranges


def detect_nonsilent(segment: PcmSegment, min_silence_ms: int, threshold_dbfs: float,
                      seek_ms: int) -> list[list[int]]:
    silent = detect_silence(segment, min_silence_ms, threshold_dbfs, seek_ms)
    length = len(segment)
    if not silent:
        return [[0, length]]
    if silent[0][0] == 0 and silent[0][1] == length:
        return []
    ranges = []
    previous_end = 0
    for start, end in silent:
        ranges.append([previous_end, start])
        previous_end = end
    if silent[-1][1] != length:
        ranges.append([previous_end, length])
    if ranges[0] == [0, 0]:
        ranges.pop(0)
    return ranges


def split_on_silence(segment: PcmSegment, min_silence_ms: int, threshold_dbfs: float,
                     keep_silence_ms: int, seek_ms: int) -> list[PcmSegment]:
    """pydub's ``split_on_silence``: the sounding parts, each with up to ``keep_silence_ms``
    of its surrounding silence (shared half and half when two parts are closer)."""
    ranges = [[start - keep_silence_ms, end + keep_silence_ms]
              for start, end in detect_nonsilent(segment, min_silence_ms, threshold_dbfs,
                                                  seek_ms)]
    for left, right in itertools.pairwise(ranges):
        if right[0] < left[1]:
            left[1] = (left[1] + right[0]) // 2
            right[0] = left[1]
    length = len(segment)
    return [segment.slice(max(start, 0), min(end, length)) for start, end in ranges]


def leading_silence_ms(segment: PcmSegment, threshold_dbfs: float, chunk_ms: int = 10) -> int:
    prefix = segment.square_prefix()
    length = len(segment)
    trim = 0
    while segment.dbfs_of(trim, trim + chunk_ms, prefix) < threshold_dbfs and trim < length:
        trim += chunk_ms
    return min(trim, length)
