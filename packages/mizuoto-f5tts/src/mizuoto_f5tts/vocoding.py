"""Mel to waveform with Vocos, falling back to tiles when the whole mel does not fit in memory."""

from __future__ import annotations

import torch

from mizuoto.nn.dsp.tiles import decode_or_tile
from mizuoto_f5tts.variants import HOP_LENGTH

# Vocos tiles when decoding runs out of memory (frames; overlap frames shared by neighbours).
TILE_FRAMES, TILE_OVERLAP = 256, 32


def vocode(vocoder, mel: torch.Tensor, *, tiled: bool, oom_fallback: bool,
           fallbacks: list[str]) -> torch.Tensor:
    """``vocoder.decode(mel)``; in tiles when ``tiled`` or, with ``oom_fallback``, when the whole
    mel runs out of memory (then ``"vocos_tiled"`` is added to ``fallbacks``)."""
    wave, in_tiles = decode_or_tile(vocoder.decode, mel, tile=TILE_FRAMES, overlap=TILE_OVERLAP,
                                    hop=HOP_LENGTH, oom_fallback=oom_fallback, force_tiles=tiled)
    if in_tiles and "vocos_tiled" not in fallbacks:
        fallbacks.append("vocos_tiled")
    return wave
