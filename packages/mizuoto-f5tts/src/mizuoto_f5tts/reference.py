"""The reference voice as upstream F5-TTS prepares it, sample for sample, without pydub.

Upstream (``preprocess_ref_audio_text`` and the start of ``infer_batch_process``) works on the
file's integer PCM samples through pydub: it cuts the recording at silences to at most 12 s,
trims silent edges, appends 50 ms of silence, writes a temporary WAV, reads it back as float,
averages the channels, raises quiet recordings to ``target_rms`` and resamples to 24 kHz.
:class:`_Pcm` holds integer PCM with pydub's millisecond arithmetic (rounded lengths, slices
that pad up to 2 ms of zeros, ``audioop`` RMS), so each step here matches pydub exactly.

Decoding: WAV and FLAC in integer PCM are read exactly as pydub reads them (24-bit samples
become 32-bit as pydub converts them). Float WAV is rounded to 32-bit integers as ffmpeg does
for pydub. Other formats (MP3, OGG, ...) are decoded by libsndfile as 16-bit, which may differ
from ffmpeg's decoder. An in-memory :class:`~mizuoto.Audio` is taken as the 16-bit WAV that
soundfile would write from it.
"""

from __future__ import annotations

import io
import itertools
import logging
import math
from pathlib import Path

import attrs
import numpy as np
import soundfile
import torch

from mizuoto.contracts.audio import Audio
from mizuoto.errors import InvalidAudio, InvalidRequest

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
MAX_REFERENCE_MS = 12000
_TAIL_SILENCE_MS = 50
_EDGE_THRESHOLD_DBFS = -42.0
# pydub.AudioSegment.silent's default rate: concatenating with it resamples slower audio up.
_SILENT_RATE = 11025


@attrs.frozen
class PreparedReference:
    """A reference ready for the model.

    ``audio`` is mono float32 at 24 kHz, raised to the target RMS when quieter (shape
    ``[1, samples]``); ``rms`` is its RMS before that, which scales the output back down.
    ``text`` is the transcript as upstream's ``preprocess_ref_audio_text`` leaves it (ending in
    ". " or "。"); ``prompt_text`` is what the model reads (one more space after an ASCII end).
    ``source_samples`` / ``source_rate`` give the length of the prepared recording before
    resampling, which sets the chunk size of long texts.
    """

    audio: torch.Tensor
    rms: torch.Tensor
    text: str
    prompt_text: str
    source_samples: int
    source_rate: int
    target_rms: float = 0.1

    @property
    def raised(self) -> bool:
        """True when the reference was quieter than the target and was scaled up."""
        return bool(self.rms < self.target_rms)


# ---------------------------------------------------------------------------------------------
# Integer PCM with pydub's semantics


@attrs.frozen(eq=False)
class _Pcm:
    """Integer PCM samples ``[frames, channels]`` as pydub's AudioSegment holds them."""

    samples: np.ndarray  # int64
    rate: int
    width: int  # bytes per sample

    @classmethod
    def silent(cls, duration_ms: int) -> _Pcm:
        frames = int(_SILENT_RATE * (duration_ms / 1000.0))
        return cls(np.zeros((frames, 1), dtype=np.int64), _SILENT_RATE, 2)

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

    def slice(self, start_ms: int | None = None, end_ms: int | None = None) -> _Pcm:
        """``segment[start_ms:end_ms]``; a slice ending past the last frame gets zero frames,
        as pydub pads slices that its rounded millisecond length makes too long."""
        first, stop, missing = self._span(start_ms, end_ms)
        samples = self.samples[first:stop]
        if missing:
            samples = np.concatenate([samples, np.zeros((missing, self.channels), np.int64)])
        return attrs.evolve(self, samples=samples)

    def reverse(self) -> _Pcm:
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

    def with_channels(self, channels: int) -> _Pcm:
        if channels == self.channels:
            return self
        if self.channels != 1:
            raise ValueError("only mono segments are widened")
        return attrs.evolve(self, samples=np.repeat(self.samples, channels, axis=1))

    def with_rate(self, rate: int) -> _Pcm:
        if rate == self.rate or self.frames == 0:
            return attrs.evolve(self, rate=rate)
        return attrs.evolve(self, samples=_ratecv(self.samples, self.width, self.rate, rate),
                            rate=rate)

    def with_width(self, width: int) -> _Pcm:
        if width == self.width:
            return self
        shift = 8 * (width - self.width)
        samples = self.samples << shift if shift > 0 else self.samples >> -shift
        return attrs.evolve(self, samples=samples, width=width)

    def __add__(self, other: _Pcm) -> _Pcm:
        channels = max(self.channels, other.channels)
        rate = max(self.rate, other.rate)
        width = max(self.width, other.width)
        a, b = (s.with_channels(channels).with_rate(rate).with_width(width) for s in (self, other))
        return _Pcm(np.concatenate([a.samples, b.samples]), rate, width)

    def to_float(self) -> torch.Tensor:
        """``[channels, frames]`` float32, as torchaudio reads the PCM WAV pydub writes."""
        scale = float(2 ** (8 * self.width - 1))
        return torch.from_numpy(np.ascontiguousarray(self.samples.T, dtype=np.float32)) / scale


def _ratecv(samples: np.ndarray, width: int, in_rate: int, out_rate: int) -> np.ndarray:
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


# ---------------------------------------------------------------------------------------------
# Decoding


def _read_pcm(source: Audio | Path) -> _Pcm:
    if isinstance(source, Audio):
        return _audio_as_pcm16(source.samples.numpy()[:, None], source.sample_rate)
    try:
        info = soundfile.info(str(source))
    except (RuntimeError, soundfile.LibsndfileError, OSError) as exc:
        raise InvalidAudio("reference.audio", f"cannot read {source}: {exc}") from exc
    if info.frames == 0:
        raise InvalidAudio("reference.audio", f"{source} holds no samples")
    subtype = info.subtype
    if subtype == "PCM_16":
        return _Pcm(_read(source, "int16").astype(np.int64), info.samplerate, 2)
    if subtype == "PCM_U8":
        # pydub reads 8-bit WAV as signed bytes (value - 128)
        return _Pcm(_read(source, "int16").astype(np.int64) >> 8, info.samplerate, 1)
    if subtype == "PCM_S8":
        return _Pcm(_read(source, "int16").astype(np.int64) >> 8, info.samplerate, 1)
    if subtype == "PCM_24":
        samples = _read(source, "int32").astype(np.int64)
        # pydub widens 24-bit samples to 32 bits with a low byte of 0xFF when negative
        samples = samples | np.where(samples < 0, 0xFF, 0)
        return _Pcm(samples, info.samplerate, 4)
    if subtype == "PCM_32":
        return _Pcm(_read(source, "int32").astype(np.int64), info.samplerate, 4)
    if subtype in ("FLOAT", "DOUBLE"):
        # pydub has ffmpeg convert float WAV to s32: llrintf(x * 2^31), clipped
        values = _read(source, "float32").astype(np.float64) * 2.0**31
        samples = np.clip(np.rint(values), -(2**31), 2**31 - 1).astype(np.int64)
        return _Pcm(samples, info.samplerate, 4)
    # compressed formats: pydub has ffmpeg decode them to 16-bit
    return _Pcm(_read(source, "int16").astype(np.int64), info.samplerate, 2)


def _read(path: Path, dtype: str) -> np.ndarray:
    try:
        data, _ = soundfile.read(str(path), dtype=dtype, always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise InvalidAudio("reference.audio", f"cannot decode {path}: {exc}") from exc
    return data


def _audio_as_pcm16(samples: np.ndarray, rate: int) -> _Pcm:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    data, _ = soundfile.read(buffer, dtype="int16", always_2d=True)
    return _Pcm(data.astype(np.int64), rate, 2)


# ---------------------------------------------------------------------------------------------
# pydub.silence, on _Pcm


def _detect_silence(segment: _Pcm, min_silence_ms: int, threshold_dbfs: float,
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


def _detect_nonsilent(segment: _Pcm, min_silence_ms: int, threshold_dbfs: float,
                      seek_ms: int) -> list[list[int]]:
    silent = _detect_silence(segment, min_silence_ms, threshold_dbfs, seek_ms)
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


def split_on_silence(segment: _Pcm, min_silence_ms: int, threshold_dbfs: float,
                     keep_silence_ms: int, seek_ms: int) -> list[_Pcm]:
    """pydub's ``split_on_silence``: the sounding parts, each with up to ``keep_silence_ms``
    of its surrounding silence (shared half and half when two parts are closer)."""
    ranges = [[start - keep_silence_ms, end + keep_silence_ms]
              for start, end in _detect_nonsilent(segment, min_silence_ms, threshold_dbfs,
                                                  seek_ms)]
    for left, right in itertools.pairwise(ranges):
        if right[0] < left[1]:
            left[1] = (left[1] + right[0]) // 2
            right[0] = left[1]
    length = len(segment)
    return [segment.slice(max(start, 0), min(end, length)) for start, end in ranges]


def _leading_silence_ms(segment: _Pcm, threshold_dbfs: float, chunk_ms: int = 10) -> int:
    prefix = segment.square_prefix()
    length = len(segment)
    trim = 0
    while segment.dbfs_of(trim, trim + chunk_ms, prefix) < threshold_dbfs and trim < length:
        trim += chunk_ms
    return min(trim, length)


def _trim_silent_edges(segment: _Pcm, threshold_dbfs: float = _EDGE_THRESHOLD_DBFS) -> _Pcm:
    segment = segment.slice(_leading_silence_ms(segment, threshold_dbfs), None)
    trailing = _leading_silence_ms(segment.reverse(), threshold_dbfs)
    if trailing > 0:
        segment = segment.slice(None, len(segment) - trailing)
    return segment


def _join_until_limit(parts: list[_Pcm]) -> _Pcm:
    """Join parts while the result stays within 12 s (always at least 6 s of them)."""
    joined = _Pcm.silent(0)
    for part in parts:
        if len(joined) > MAX_REFERENCE_MS // 2 and len(joined + part) > MAX_REFERENCE_MS:
            log.info("reference is over %d ms: clipped at a silence", MAX_REFERENCE_MS)
            break
        joined = joined + part
    return joined


def clip_reference(segment: _Pcm) -> _Pcm:
    """Upstream's reference clipping: cut at a long silence (1 s below -50 dBFS), else at a
    short one (0.1 s below -40 dBFS), else hard at 12 s; trim the edges; add 50 ms silence."""
    clipped = _join_until_limit(split_on_silence(segment, 1000, -50, 1000, 10))
    if len(clipped) > MAX_REFERENCE_MS:
        clipped = _join_until_limit(split_on_silence(segment, 100, -40, 1000, 10))
    if len(clipped) > MAX_REFERENCE_MS:
        clipped = clipped.slice(None, MAX_REFERENCE_MS)
    # upstream pads through audioop.ratecv: 1198 samples at 24 kHz, not 1200
    return _trim_silent_edges(clipped) + _Pcm.silent(_TAIL_SILENCE_MS)


# ---------------------------------------------------------------------------------------------
# Text


def prepare_reference_text(text: str | None) -> str:
    """End the transcript as upstream does: with ". " unless it ends in ". " or "。"."""
    if text is None or not text.strip():
        raise InvalidRequest("reference.text", "is required by F5-TTS",
                             "give the transcript of the reference recording")
    if not text.endswith(". ") and not text.endswith("。"):
        text += " " if text.endswith(".") else ". "
    return text


def prompt_text(text: str) -> str:
    """The transcript as the model reads it: one more space after a 1-byte last character."""
    return text + " " if len(text[-1].encode("utf-8")) == 1 else text


# ---------------------------------------------------------------------------------------------
# The whole preparation


def prepare_pcm(source: Audio | Path) -> tuple[torch.Tensor, int]:
    """The clipped, trimmed, padded reference as float32 ``[channels, samples]`` and its rate:
    what upstream reads back from its temporary WAV."""
    pcm = clip_reference(_read_pcm(source))
    waveform = pcm.to_float()
    if not bool(waveform.abs().amax() > 0):
        raise InvalidAudio("reference.audio", "is silent", "give a recording of the voice")
    return waveform, pcm.rate


def condition_audio(waveform: torch.Tensor, rate: int, target_rms: float,
                    resample) -> tuple[torch.Tensor, torch.Tensor]:
    """Average the channels, raise to ``target_rms`` when quieter (RMS measured before
    resampling, as upstream), and resample to 24 kHz. Returns ``(audio [1, n], rms)``."""
    audio = waveform
    if audio.shape[0] > 1:
        audio = torch.mean(audio, dim=0, keepdim=True)
    rms = torch.sqrt(torch.mean(torch.square(audio)))
    if rms < target_rms:
        audio = audio * target_rms / rms
    if rate != SAMPLE_RATE:
        audio = resample(audio, rate, SAMPLE_RATE)
    return audio, rms


def prepare_reference(source: Audio | Path, text: str | None, *, target_rms: float = 0.1,
                      resample=None) -> PreparedReference:
    """Prepare a reference recording and its transcript exactly as upstream F5-TTS does."""
    if resample is None:
        from mizuoto.nn.dsp.resample import resample
    if isinstance(source, Path) and not source.is_file():
        raise InvalidAudio("reference.audio", f"{source} does not exist")
    prepared_text = prepare_reference_text(text)
    waveform, rate = prepare_pcm(source)
    audio, rms = condition_audio(waveform, rate, target_rms, resample)
    return PreparedReference(audio=audio, rms=rms, text=prepared_text,
                             prompt_text=prompt_text(prepared_text),
                             source_samples=int(waveform.shape[-1]), source_rate=rate,
                             target_rms=target_rms)
