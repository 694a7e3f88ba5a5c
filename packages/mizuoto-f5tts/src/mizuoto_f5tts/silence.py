"""Upstream's optional silence removal on generated audio (``remove_silence_for_generated_wav``).

Upstream writes the output with soundfile (16-bit PCM WAV), cuts every silence longer than
1 s (below -50 dBFS) down to 0.5 s on each side with pydub, and writes the 16-bit result. We
quantise the same way (soundfile's float to PCM_16 conversion, in memory), cut with the same
pydub arithmetic (:mod:`mizuoto_f5tts.pcm`), and return the 16-bit samples as float32 divided
by 32768, as soundfile reads upstream's file back.
"""

from __future__ import annotations

import io

import numpy as np
import soundfile

from mizuoto_f5tts.pcm import PcmSegment, split_on_silence


def remove_silence(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Shorten the long silences of ``samples`` (float32 or float64) as upstream does."""
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sample_rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    pcm, _ = soundfile.read(buffer, dtype="int16", always_2d=True)
    segment = PcmSegment(pcm.astype(np.int64), sample_rate, 2)
    joined = PcmSegment.silent(0)
    for part in split_on_silence(segment, 1000, -50, 500, 10):
        joined = joined + part
    return (joined.samples[:, 0].astype(np.float32) / 32768).astype(np.float32)
