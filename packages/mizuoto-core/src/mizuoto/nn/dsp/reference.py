"""A reference recording as an engine needs it: mono float32 at the engine's rate.

Above the contracts (it takes their :class:`~mizuoto.contracts.requests.Reference` and
:class:`~mizuoto.contracts.audio.Audio`); plugins import it as ``mizuoto.plugin.read_reference``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.requests import Reference
from mizuoto.nn.dsp.audio_io import check_not_silent, read_audio, to_mono
from mizuoto.nn.dsp.resample import resample


def read_reference(source: Reference | Audio | str | Path, sample_rate: int, *,
                   field: str = "reference.audio") -> Audio:
    """A reference recording as mono float32 ``Audio`` at ``sample_rate`` (the engine's).

    ``source``: a :class:`Reference`, an :class:`Audio`, or a path to a WAV, FLAC, OGG or MP3
    file. A missing, unreadable or silent recording raises
    :class:`~mizuoto.errors.InvalidAudio` naming ``field``. Other rates are resampled with a
    windowed-sinc filter (``torchaudio.functional.resample``'s arithmetic).
    """
    if isinstance(source, Reference):
        source = source.audio
    if isinstance(source, Audio):
        samples, rate = source.samples.to(torch.float32), source.sample_rate
    else:
        channels, rate = read_audio(source, field=field)
        samples = to_mono(channels)[0]
    check_not_silent(samples, field)
    return Audio(resample(samples, rate, sample_rate), sample_rate)
