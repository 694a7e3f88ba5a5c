"""Joining the audio of long-text chunks with upstream's crossfade."""

from __future__ import annotations

import numpy as np

from mizuoto_f5tts.variants import SAMPLE_RATE


def join_chunks(waves: list[np.ndarray], cross_fade_duration: float) -> np.ndarray:
    """Join chunk audio as upstream does, in upstream's dtype.

    Upstream's crossfade weights are float64 ``np.linspace``, so its multi-chunk output is
    float64 (one chunk, or no crossfade, stays float32). The engine casts the result to
    float32 last, after the optional silence removal, which quantises upstream's dtype.
    """
    if len(waves) == 1:
        return waves[0]
    if cross_fade_duration <= 0:
        return np.concatenate(waves)
    fade = int(cross_fade_duration * SAMPLE_RATE)
    # Upstream concatenates the whole joined audio at every chunk (quadratic in the length).
    # Here only the tail a crossfade can still reach (the last ``fade`` samples) is rebuilt;
    # the samples and the final dtype are upstream's.
    done: list[np.ndarray] = []
    tail, total = waves[0], len(waves[0])
    for following in waves[1:]:
        overlap = min(fade, total, len(following))
        if overlap <= 0:
            tail = np.concatenate([tail, following])
        else:
            fade_out = np.linspace(1, 0, overlap)
            fade_in = np.linspace(0, 1, overlap)
            blended = tail[-overlap:] * fade_out + following[:overlap] * fade_in
            tail = np.concatenate([tail[:-overlap], blended, following[overlap:]])
        total += len(following) - overlap
        if len(tail) > fade:
            done.append(tail[:len(tail) - fade])
            tail = tail[len(tail) - fade:]
    return np.concatenate([*done, tail])
