"""The reference recording the suite clones from: a synthetic voiced signal, the same every run.

Random-init models do not care what the reference says, but engines check that it is audio
and not silence, and some measure its loudness and pitch. A harmonic sum with a gliding
fundamental, three formant resonances and a syllable-rate envelope looks enough like a voice
for every such check, and needs no data files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mizuoto.nn.dsp.audio_io import write_audio

REFERENCE_SECONDS = 1.0
REFERENCE_TEXT = "A steady voice reads this line."

_FORMANTS_HZ = ((700.0, 130.0), (1220.0, 70.0), (2600.0, 160.0))  # an open vowel /a/


def voiced_signal(sample_rate: int, seconds: float = REFERENCE_SECONDS) -> np.ndarray:
    """Mono float32 samples of a vowel-like voice at about 120 Hz, peak 0.5."""
    time = np.arange(round(sample_rate * seconds), dtype=np.float64) / sample_rate
    f0 = 120.0 + 20.0 * np.sin(2 * np.pi * 1.5 * time)  # a gentle intonation contour
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = np.zeros_like(time)
    for harmonic in range(1, 40):
        frequency = harmonic * f0
        if frequency.max() >= 0.45 * sample_rate:
            break
        gain = sum(np.exp(-0.5 * ((frequency - centre) / width) ** 2)
                   for centre, width in _FORMANTS_HZ)
        voiced += (0.15 + gain) / harmonic * np.sin(harmonic * phase)
    syllables = 0.55 - 0.45 * np.cos(2 * np.pi * 4.0 * time)
    fade = np.minimum(1.0, np.minimum(time, time[-1] - time) / 0.02)
    signal = voiced * syllables * fade
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def write_reference(path: Path, sample_rate: int) -> Path:
    """Write :func:`voiced_signal` as a 16-bit WAV file."""
    return write_audio(path, voiced_signal(sample_rate), sample_rate, subtype="PCM_16")


def write_silence(path: Path, sample_rate: int) -> Path:
    silence = np.zeros(round(sample_rate * REFERENCE_SECONDS), np.float32)
    return write_audio(path, silence, sample_rate, subtype="PCM_16")


def other_reference(sample_rate: int):
    """A second voiced reference: :func:`voiced_signal` made at half the rate and played at
    ``sample_rate`` (twice the pitch, 0.75 s), at a third of the level."""
    import torch

    from mizuoto import Audio, Reference

    samples = torch.from_numpy(voiced_signal(sample_rate // 2, seconds=1.5))
    return Reference(Audio(samples * 0.3, sample_rate), text=REFERENCE_TEXT)
