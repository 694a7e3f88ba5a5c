"""Reading and checking audio files (soundfile: WAV, FLAC and what libsndfile reads).

:func:`read_audio` gives the same float32 values as ``torchaudio.load`` for PCM and float WAV
(16-bit PCM is ``x / 32768``), as ``(channels, samples)``. Problems with an input file raise
:class:`~mizuoto.errors.InvalidAudio` naming the request field the caller passes in.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from torch import Tensor

# Writing lives with the formats (mizuoto.audio_encoding); its names stay importable here,
# where plugins written against earlier releases import them.
from mizuoto.audio_encoding import METADATA_KEYS, write_audio  # noqa: F401
from mizuoto.errors import InvalidAudio

# The checks of input audio live with validation (requests check an Audio reference with them,
# without importing torch); their names stay importable here.
from mizuoto.validation.audio import (  # noqa: F401
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    SILENCE_PEAK,
    check_input_audio,
    check_sample_rate,
)

_READ_FIX = "pass a WAV, FLAC, OGG or MP3 file"


def read_audio(path: str | Path, *, field: str = "audio") -> tuple[Tensor, int]:
    """Read a file as ``(float32 Tensor[channels, samples], sample_rate)``.

    Raises :class:`InvalidAudio` for ``field`` when the file is missing, unreadable, has no
    samples, NaN or infinite samples or a rate outside [:data:`MIN_SAMPLE_RATE`,
    :data:`MAX_SAMPLE_RATE`] (silence is checked separately by :func:`check_not_silent`).
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidAudio(field, f"file not found: {path}", _READ_FIX)
    try:
        data, sample_rate = sf.read(path, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise InvalidAudio(field, f"cannot read {path} as audio: {exc}", _READ_FIX) from exc
    if data.shape[0] == 0:
        raise InvalidAudio(field, f"{path} has no samples", "pass a file with audio in it")
    check_input_audio(data, int(sample_rate), field, str(path))
    # soundfile reads (samples, channels); torchaudio's layout is (channels, samples).
    return torch.from_numpy(np.ascontiguousarray(data.T)), int(sample_rate)


def to_mono(samples: Tensor) -> Tensor:
    """Average the channels of ``(channels, samples)`` into ``(1, samples)``.

    One channel comes back unchanged; this is ``mean(dim=0, keepdim=True)`` as F5-TTS and
    VoxCPM apply it to ``torchaudio.load`` output.
    """
    if samples.dim() != 2:
        raise ValueError(f"expected (channels, samples), got shape {tuple(samples.shape)}")
    if samples.shape[0] == 1:
        return samples
    return samples.mean(dim=0, keepdim=True)


def check_not_silent(samples: Tensor | np.ndarray, field: str, *,
                     peak: float = SILENCE_PEAK) -> None:
    """Raise :class:`InvalidAudio` for ``field`` if no sample exceeds ``peak`` in magnitude."""
    values = torch.as_tensor(samples)
    if values.numel() == 0:
        raise InvalidAudio(field, "has no samples", "pass audio with speech in it")
    loudest = float(values.detach().abs().max())
    if not loudest > peak:
        raise InvalidAudio(field, f"is silent (peak {loudest:.2g})",
                           "pass a recording with speech in it")
