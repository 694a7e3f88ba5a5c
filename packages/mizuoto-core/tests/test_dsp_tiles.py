"""Tiled decoding: exact for frame-local decoders, close for convolutional ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mizuoto.nn.dsp.tiles import decode_tiled, iter_decoded_tiles


def _frames(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("total", [1, 100, 256, 257, 300, 480, 481, 1000, 1234])
def test_frame_local_decoder_is_exact(total):
    frames = _frames(2, total, seed=total)

    def decode(tile):
        return tile.repeat_interleave(8, dim=-1)

    tiled = decode_tiled(decode, frames, tile=256, overlap=32, hop=8)
    assert torch.equal(tiled, decode(frames))


def test_leading_dims_may_change_and_pieces_concatenate():
    frames = _frames(2, 5, 700, seed=1)  # (batch, channels, frames)
    weights = torch.linspace(-1, 1, 5)

    def decode(tile):  # (batch, channels, n) -> (batch, 1, n * 4), no context across frames
        return torch.einsum("c,bcn->bn", weights, tile)[:, None].repeat_interleave(4, dim=-1)

    pieces = list(iter_decoded_tiles(decode, frames, tile=100, overlap=20, hop=4))
    assert len(pieces) > 10
    assert torch.equal(torch.cat(pieces, dim=-1), decode(frames))
    assert torch.equal(decode_tiled(decode, frames, tile=100, overlap=0, hop=4), decode(frames))


def test_convolutional_decoder_error_is_small():
    # receptive field: 5 frames each way (kernels 7 and 5)
    torch.manual_seed(0)
    hop = 8
    decoder = nn.Sequential(
        nn.Conv1d(4, 16, kernel_size=7, padding=3),
        nn.Tanh(),
        nn.Conv1d(16, 16, kernel_size=5, padding=2),
        nn.Tanh(),
        nn.ConvTranspose1d(16, 1, kernel_size=hop, stride=hop),
    ).eval()
    frames = _frames(1, 4, 900, seed=2)
    with torch.no_grad():
        whole = decoder(frames)
        wide = decode_tiled(decoder, frames, tile=128, overlap=32, hop=hop)
        narrow = decode_tiled(decoder, frames, tile=128, overlap=8, hop=hop)
        butted = decode_tiled(decoder, frames, tile=128, overlap=0, hop=hop)

    def error(tiled):
        assert tiled.shape == whole.shape == (1, 1, 900 * hop)
        return float((tiled - whole).abs().max() / whole.abs().max())

    # margin overlap // 4 = 8 frames covers the receptive field: equal up to rounding
    assert error(wide) <= 1e-6
    # a 2-frame margin does not: an error, but well below butting tiles together
    assert 0 < error(narrow) < 0.2
    assert error(narrow) < error(butted) / 2


def test_bad_arguments():
    frames = _frames(1, 600)
    with pytest.raises(ValueError, match="overlap"):
        decode_tiled(lambda t: t, frames, tile=100, overlap=60, hop=1)
    with pytest.raises(ValueError, match="hop=4"):
        decode_tiled(lambda t: t, frames, tile=100, overlap=10, hop=4)
