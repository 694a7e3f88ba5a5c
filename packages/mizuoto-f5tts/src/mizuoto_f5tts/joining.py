"""Joining the audio of long-text chunks with upstream's crossfade."""

from __future__ import annotations

import numpy as np

from mizuoto_f5tts.variants import SAMPLE_RATE


class CrossFade:
    """Upstream's crossfade, one chunk at a time: :meth:`add` returns the samples no later
    chunk can change, :meth:`finish` the rest (the overlap tail kept for the next chunk).

    Upstream's crossfade weights are float64 ``np.linspace``, so what is blended is float64
    (the first chunk, or all with no crossfade, stays float32). Upstream concatenates the
    whole joined audio at every chunk (quadratic in the length); here only the tail a
    crossfade can still reach (the last ``fade`` samples) is kept, with upstream's samples.
    """

    def __init__(self, cross_fade_duration: float) -> None:
        self.fade = int(cross_fade_duration * SAMPLE_RATE) if cross_fade_duration > 0 else 0
        self._tail: np.ndarray | None = None
        self._total = 0  # samples joined so far, final or not

    def add(self, wave: np.ndarray) -> np.ndarray:
        """Join ``wave``; the samples now final (possibly none)."""
        if self._tail is None:
            tail = wave
        elif not self.fade:
            tail = np.concatenate([self._tail, wave])
        else:
            overlap = min(self.fade, self._total, len(wave))
            if overlap <= 0:
                tail = np.concatenate([self._tail, wave])
            else:
                fade_out = np.linspace(1, 0, overlap)
                fade_in = np.linspace(0, 1, overlap)
                blended = self._tail[-overlap:] * fade_out + wave[:overlap] * fade_in
                tail = np.concatenate([self._tail[:-overlap], blended, wave[overlap:]])
            self._total -= overlap
        self._total += len(wave)
        cut = max(len(tail) - self.fade, 0)
        self._tail = tail[cut:]
        return tail[:cut]

    def finish(self) -> np.ndarray:
        """The samples kept back for a crossfade that no chunk follows."""
        tail, self._tail = self._tail, None
        return tail if tail is not None else np.zeros(0, np.float32)


def join_chunks(waves: list[np.ndarray], cross_fade_duration: float) -> np.ndarray:
    """Join chunk audio as upstream does, in upstream's dtype (see :class:`CrossFade`). The
    engine casts the result to float32 last, after the optional silence removal, which
    quantises upstream's dtype."""
    if len(waves) == 1:
        return waves[0]
    joiner = CrossFade(cross_fade_duration)
    return np.concatenate([*(joiner.add(wave) for wave in waves), joiner.finish()])
