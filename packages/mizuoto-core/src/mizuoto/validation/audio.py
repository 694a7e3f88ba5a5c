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
