"""Audio as requests and results carry it."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import attrs

from mizuoto.errors import InvalidAudio

if TYPE_CHECKING:
    import numpy as np
    import torch


def _to_float32_mono(value) -> torch.Tensor:
    # torch and numpy are imported with the first Audio, not with ``import mizuoto``.
    import numpy as np
    import torch

    try:
        tensor = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor)
                                 else value).detach().to("cpu")
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidAudio("audio.samples", f"are not numbers ({exc})") from None
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise InvalidAudio("audio.samples", f"must be real numbers, got {tensor.dtype}",
                           "pass float samples in [-1, 1]")
    if not tensor.is_floating_point():
        # integer PCM is scaled by its full range, as soundfile reads it: int16 / 32768,
        # int32 / 2**31, uint8 (offset binary) (x - 128) / 128
        if tensor.dtype == torch.uint8:
            tensor = (tensor.to(torch.float64) - 128.0) / 128.0
        else:
            tensor = tensor.to(torch.float64) / float(-torch.iinfo(tensor.dtype).min)
    # float64 (and half precision) samples are rounded to float32, values otherwise unchanged
    tensor = tensor.to(torch.float32)
    if tensor.ndim != 1:
        raise InvalidAudio("audio.samples", f"must be 1-D (mono), got shape {tuple(tensor.shape)}")
    return tensor


def _check_rate(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not value > 0:
        raise InvalidAudio("audio.sample_rate", f"must be a positive integer (Hz), got {value!r}")


@attrs.frozen
class Audio:
    """Mono float32 samples on the CPU and their sample rate.

    ``samples`` may be any 1-D torch tensor, numpy array or sequence of numbers: floats are
    kept (rounded to float32); integer PCM is scaled by its type's full range (int16 divided
    by 32768, int32 by 2**31, uint8 as offset binary), so an int16 buffer becomes [-1, 1).
    Anything that is not 1-D (stereo, batches) raises :class:`~mizuoto.errors.InvalidAudio`:
    mix down first.
    """

    samples: torch.Tensor = attrs.field(converter=_to_float32_mono)
    sample_rate: int = attrs.field(validator=_check_rate)

    @property
    def num_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def numpy(self) -> np.ndarray:
        return self.samples.numpy()

    def save(self, path, *, metadata: dict[str, str] | None = None) -> None:
        """Write a file in the format its extension names (.wav, .flac, .mp3, .opus/.ogg, .aac,
        .pcm: :data:`mizuoto.audio_formats.FORMATS`), atomically; ``metadata`` is kept by WAV
        and FLAC."""
        # lazy: soundfile and the encoders load with the first save, not with ``import mizuoto``
        from mizuoto.audio_encoding import write_audio

        write_audio(path, self.samples, self.sample_rate, metadata=metadata)
