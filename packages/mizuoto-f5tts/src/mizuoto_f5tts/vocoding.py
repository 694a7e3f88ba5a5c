"""Mel to waveform with Vocos, falling back to tiles when the whole mel does not fit in memory."""

from __future__ import annotations

import logging

import torch

from mizuoto_f5tts.variants import HOP_LENGTH

log = logging.getLogger(__name__)

# Vocos tiles when decoding runs out of memory (frames; overlap frames shared by neighbours).
TILE_FRAMES, TILE_OVERLAP = 256, 32


def vocode(vocoder, mel: torch.Tensor, *, tiled: bool, oom_fallback: bool,
           fallbacks: list[str]) -> torch.Tensor:
    """``vocoder.decode(mel)``; in tiles when ``tiled`` or, with ``oom_fallback``, when the whole
    mel runs out of memory (then ``"vocos_tiled"`` is added to ``fallbacks``)."""
    if tiled:
        return _decode_tiled(vocoder, mel, fallbacks)
    try:
        return vocoder.decode(mel)
    except torch.OutOfMemoryError:
        if not oom_fallback:
            raise
        log.warning("Vocos ran out of memory on %d frames: decoding in tiles", mel.shape[-1])
        if mel.is_cuda:
            torch.cuda.empty_cache()
        return _decode_tiled(vocoder, mel, fallbacks)


def _decode_tiled(vocoder, mel: torch.Tensor, fallbacks: list[str]) -> torch.Tensor:
    from mizuoto.nn.dsp.tiles import decode_tiled

    if "vocos_tiled" not in fallbacks:
        fallbacks.append("vocos_tiled")
    return decode_tiled(vocoder.decode, mel, tile=TILE_FRAMES, overlap=TILE_OVERLAP,
                        hop=HOP_LENGTH)
