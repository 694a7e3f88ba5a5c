"""Decoding long frame sequences in overlapping tiles, joined with a linear crossfade.

A vocoder or codec decoder maps ``T`` frames to ``T * hop`` samples; run on a long input at
once its activations grow with ``T``. Here the frames are cut into tiles of ``tile`` frames,
neighbours sharing ``overlap`` frames, each tile is decoded on its own and the pieces are
joined, so the decoder never holds more than one tile (DAC decodes long audio the same way).
:func:`decode_or_tile` decodes the whole input at once and falls back to tiles when that runs
out of memory: the engines' ``compute.oom_fallback``.

Crossfade placement: tile ``k + 1`` starts ``tile - overlap`` frames after tile ``k``, so
both decode the ``overlap`` shared frames. Near its own edge a tile is spoilt by the
decoder's padding, so the first quarter of the shared frames (``overlap // 4``) is taken from
the earlier tile only, the last quarter from the later tile only, and the middle half is
blended, the later tile's weight rising linearly from ``1 / (n + 1)`` to ``n / (n + 1)``
over its ``n`` samples. A decoder whose receptive field reaches fewer than ``overlap // 4``
frames each way is then reproduced up to rounding. The blend is
``lerp(earlier, later, weight)``, which returns the earlier value exactly where both tiles
agree: a decoder without context across frames gives bit-identical output tiled and untiled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Decode = Callable[[Tensor], Tensor]


def decode_or_tile(
    decode: Decode,
    frames: Tensor,
    *,
    tile: int,
    overlap: int,
    hop: int,
    oom_fallback: bool,
    force_tiles: bool = False,
) -> tuple[Tensor, bool]:
    """``decode(frames)`` in one call, or in tiles (:func:`decode_tiled`) when ``force_tiles``
    or when the one call runs out of memory and ``oom_fallback`` is on.

    Returns the samples and whether they were decoded in tiles. Without ``oom_fallback`` the
    out-of-memory error propagates unchanged (``torch.OutOfMemoryError`` on CUDA, the
    allocator's ``RuntimeError`` on the CPU), as does any other error.
    """
    from mizuoto.runtime.out_of_memory import is_out_of_memory, release_cached_memory

    if not force_tiles:
        try:
            return decode(frames), False
        except RuntimeError as error:  # torch.OutOfMemoryError is one
            if not (oom_fallback and is_out_of_memory(error)):
                raise
            log.warning("decoding %d frames at once ran out of memory: decoding in tiles of %d "
                        "frames sharing %d", frames.shape[-1], tile, overlap)
        # out of the except block: the failed call's activations, held by the traceback, are
        # freed before the tiles are decoded
        release_cached_memory(frames.device)
    return decode_tiled(decode, frames, tile=tile, overlap=overlap, hop=hop), True


def iter_decoded_tiles(
    decode: Decode,
    frames: Tensor,
    *,
    tile: int = 256,
    overlap: int = 32,
    hop: int = 256,
) -> Iterator[Tensor]:
    """Yield the decoded samples of ``frames`` (``[..., T]``) in order, piece by piece.

    ``decode`` maps a ``[..., n]`` frame tile to ``[..., n * hop]`` samples (its leading dims
    may differ from the frames'). The pieces concatenated along the last dim are the output
    of :func:`decode_tiled`; the last ``overlap * hop`` samples of a tile are held back
    until the next tile is decoded.
    """
    _check_tiling(tile, overlap, hop)
    total = frames.shape[-1]
    if total <= tile:
        yield _decode_checked(decode, frames, hop)
        return
    shared = overlap * hop
    margin = (overlap // 4) * hop
    fade = shared - 2 * margin
    pending: Tensor | None = None  # the previous tile's last ``shared`` samples
    start = 0
    while True:
        end = min(start + tile, total)
        samples = _decode_checked(decode, frames[..., start:end], hop)
        if pending is not None and shared:
            blended = torch.lerp(pending[..., margin : margin + fade],
                                 samples[..., margin : margin + fade], _fade_in(fade, samples))
            yield torch.cat([pending[..., :margin], blended, samples[..., margin + fade : shared]],
                            dim=-1)
            samples = samples[..., shared:]
        if end >= total:
            yield samples
            return
        if shared:
            yield samples[..., :-shared]
            pending = samples[..., -shared:].clone()
        else:
            yield samples
        start += tile - overlap


def decode_tiled(
    decode: Decode,
    frames: Tensor,
    *,
    tile: int = 256,
    overlap: int = 32,
    hop: int = 256,
) -> Tensor:
    """Decode ``frames`` (``[..., T]``) tile by tile into ``[..., T * hop]`` samples.

    Peak decoder memory is that of one ``tile``-frame call, whatever ``T``. Inputs of at most
    ``tile`` frames are decoded in one call. See the module docstring for the crossfade.
    """
    output: Tensor | None = None
    position = 0
    for piece in iter_decoded_tiles(decode, frames, tile=tile, overlap=overlap, hop=hop):
        if output is None:
            if piece.shape[-1] == frames.shape[-1] * hop:
                return piece  # one tile
            # filled in place: no list of pieces plus a concatenated copy
            output = piece.new_empty(piece.shape[:-1] + (frames.shape[-1] * hop,))
        output[..., position : position + piece.shape[-1]] = piece
        position += piece.shape[-1]
    return output


def _fade_in(length: int, like: Tensor) -> Tensor:
    """Weights ``1/(n+1) ... n/(n+1)`` of the later tile, in ``like``'s dtype and device."""
    steps = torch.arange(1, length + 1, dtype=torch.float64, device=like.device)
    return (steps / (length + 1)).to(like.dtype)


def _decode_checked(decode: Decode, frames: Tensor, hop: int) -> Tensor:
    samples = decode(frames)
    expected = frames.shape[-1] * hop
    if samples.shape[-1] != expected:
        raise ValueError(
            f"decoder gave {samples.shape[-1]} samples for {frames.shape[-1]} frames; tiled "
            f"decoding needs exactly hop={hop} samples per frame ({expected})"
        )
    return samples


def _check_tiling(tile: int, overlap: int, hop: int) -> None:
    if hop < 1:
        raise ValueError(f"hop must be positive, got {hop}")
    if overlap < 0 or tile < 1 or 2 * overlap > tile:
        raise ValueError(
            f"need 0 <= overlap <= tile / 2, got tile={tile}, overlap={overlap} "
            "(a frame may be shared by two tiles, not three)"
        )
