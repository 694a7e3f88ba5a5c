"""Uploaded reference clips: checked by their header before anything is decoded.

A compressed file is small and its decoded samples are not: a 200 KB FLAC can declare a minute
of 8 channels at 384 kHz, a gigabyte of float32. So a clip is refused by what it would decode
to (rate, channels, seconds, and their product) before decoding, and decoded in blocks of a
second, each mixed down to mono at once; the decoded frames are counted, so a header that
understates the length is caught too. The whole clip is never held with all its channels.
"""

from __future__ import annotations

import io

import attrs
import numpy as np

from mizuoto.serve.errors import APIError, bad_request, from_mizuoto

#: Highest sample rate of an uploaded clip (Hz); speech models run at 16 to 48 kHz.
MAX_UPLOAD_RATE = 192_000
#: Most channels of an uploaded clip.
MAX_UPLOAD_CHANNELS = 8
#: The decoded size allowed for the longest clip: ``max_seconds`` at this rate in stereo.
BUDGET_RATE, BUDGET_CHANNELS = 48_000, 2


@attrs.frozen
class ClipLimits:
    """What an uploaded clip may decode to: ``max_seconds`` long, and at most ``max_samples``
    samples over all channels (``rate x channels x seconds``)."""

    max_seconds: float
    max_samples: int

    @classmethod
    def for_seconds(cls, max_seconds: float) -> ClipLimits:
        return cls(max_seconds, int(max_seconds * BUDGET_RATE * BUDGET_CHANNELS))


def _too_large(message: str) -> APIError:
    return APIError(413, message, param="audio", code="audio_too_large")


def _check_header(rate: int, channels: int, frames: int, limits: ClipLimits) -> None:
    if not 0 < rate <= MAX_UPLOAD_RATE:
        raise _too_large(f"the audio's sample rate is {rate} Hz, more than {MAX_UPLOAD_RATE}: "
                         "resample it (speech models use 16 to 48 kHz)")
    if not 0 < channels <= MAX_UPLOAD_CHANNELS:
        raise _too_large(f"the audio has {channels} channels, more than "
                         f"{MAX_UPLOAD_CHANNELS}: send mono or stereo")
    _check_length(rate, channels, frames, limits)


def _check_length(rate: int, channels: int, frames: int, limits: ClipLimits) -> None:
    seconds = frames / rate
    if seconds > limits.max_seconds:
        raise APIError(413, f"the audio lasts {seconds:.1f} s, more than "
                       f"{limits.max_seconds:g} s", param="audio", code="audio_too_long")
    if frames * channels > limits.max_samples:
        raise _too_large(f"the audio decodes to {frames * channels} samples ({rate} Hz x "
                         f"{channels} channels x {seconds:.1f} s), more than "
                         f"{limits.max_samples}: send mono or stereo at up to "
                         f"{BUDGET_RATE // 1000} kHz, or a shorter clip")


def read_clip(data: bytes, limits: ClipLimits):
    """The uploaded ``data`` as a mono :class:`~mizuoto.Audio` (channels averaged); a 413 for
    a clip over ``limits``, a 400 for one that cannot be read."""
    import soundfile as sf

    from mizuoto.contracts.audio import Audio

    try:
        with sf.SoundFile(io.BytesIO(data)) as handle:
            rate, channels = handle.samplerate, handle.channels
            _check_header(rate, channels, handle.frames, limits)
            samples = np.empty(handle.frames, np.float32)  # mono: the only full-length array
            decoded = 0
            for block in handle.blocks(blocksize=rate, dtype="float32", always_2d=True):
                end = decoded + len(block)
                _check_length(rate, channels, end, limits)  # the header may understate
                if end > len(samples):
                    samples = np.concatenate([samples, np.empty(end - len(samples), np.float32)])
                samples[decoded:end] = block.mean(axis=1)
                decoded = end
    except APIError:
        raise
    except Exception as exc:  # libsndfile's errors have several types
        raise bad_request(f"the audio cannot be read ({exc}): send WAV, FLAC, OGG or MP3",
                          param="audio") from None
    samples = samples[:decoded]
    try:
        return Audio(samples, rate)
    except Exception as exc:
        raise from_mizuoto(exc) from exc
