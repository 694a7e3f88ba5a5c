"""Checks of input audio (a reference, a recording to edit): its rate, that it has samples, and
that they are finite. Torch and numpy are imported when a check runs, not with this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mizuoto.errors import InvalidAudio

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Sample rates accepted for input audio (a reference, a recording to edit), in Hz.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 768000

#: Peak below which audio is silent: about -80 dBFS, i.e. at most three steps of 16-bit PCM.
#: Digital silence and dither, decided from the samples, not from how loud speech should be:
#: a quiet recording (a peak of -30 dBFS) is a reference, however faint.
SILENCE_PEAK = 1e-4


def check_sample_rate(sample_rate: int, field: str, name: str = "the audio") -> None:
    """Raise :class:`InvalidAudio` for ``field`` unless ``sample_rate`` is within
    [:data:`MIN_SAMPLE_RATE`, :data:`MAX_SAMPLE_RATE`] Hz."""
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise InvalidAudio(field, f"{name} has a sample rate of {sample_rate} Hz",
                           f"use a rate in [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz")


def check_input_audio(samples: torch.Tensor | np.ndarray, sample_rate: int, field: str,
                      name: str = "the audio") -> None:
    """Raise :class:`InvalidAudio` for ``field`` unless the rate is within
    [:data:`MIN_SAMPLE_RATE`, :data:`MAX_SAMPLE_RATE`], there are samples and every one is
    finite."""
    import numpy as np
    import torch

    check_sample_rate(sample_rate, field, name)
    count = samples.numel() if isinstance(samples, torch.Tensor) else np.asarray(samples).size
    if count == 0:
        raise InvalidAudio(field, f"{name} has no samples", "pass audio with speech in it")
    finite = torch.isfinite(samples).all() if isinstance(samples, torch.Tensor) \
        else np.isfinite(samples).all()
    if not finite:
        raise InvalidAudio(field, f"{name} holds NaN or infinite samples",
                           "pass a recording with finite samples")


def check_audible_file(path, field: str) -> None:
    """Raise :class:`InvalidAudio` for ``field`` when the audio file at ``path`` is silent (no
    sample above :data:`SILENCE_PEAK`): read with soundfile, block by block, before any model
    loads. A file that is missing or cannot be read is left to the reader that needs it, which
    names the problem."""
    import numpy as np
    import soundfile

    loudest = 0.0
    try:
        with soundfile.SoundFile(str(path)) as audio:
            for block in audio.blocks(blocksize=1 << 16, dtype="float32", always_2d=True):
                finite = block[np.isfinite(block)]
                loudest = max(loudest, float(np.abs(finite).max(initial=0.0)))
                if loudest > SILENCE_PEAK:
                    return
    except (OSError, RuntimeError, soundfile.LibsndfileError):
        return
    raise InvalidAudio(field, f"is silent (peak {loudest:.2g}, the floor is {SILENCE_PEAK:g})",
                       "pass a recording with speech in it")
