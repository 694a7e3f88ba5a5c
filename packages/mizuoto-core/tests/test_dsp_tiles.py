"""Tiled decoding: exact for frame-local decoders, close for convolutional ones; the
out-of-memory fallback to tiles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mizuoto.nn.dsp.tiles import decode_or_tile, decode_tiled, iter_decoded_tiles
from mizuoto.runtime.out_of_memory import is_out_of_memory


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


def _failing_above(limit: int, error: BaseException):
    """A frame-local decoder that raises ``error`` on inputs longer than ``limit`` frames."""
    calls = []

    def decode(tile):
        calls.append(tile.shape[-1])
        if tile.shape[-1] > limit:
            raise error
        return tile.repeat_interleave(4, dim=-1)

    return decode, calls


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 8589934592 bytes."),
    RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB)"),
])
def test_out_of_memory_falls_back_to_tiles(error):
    frames = _frames(1, 3, 600, seed=3)
    decode, calls = _failing_above(256, error)
    samples, tiled = decode_or_tile(decode, frames, tile=256, overlap=32, hop=4,
                                    oom_fallback=True)
    assert tiled and calls == [600, 256, 256, 152]
    assert torch.equal(samples, frames.repeat_interleave(4, dim=-1))
    with pytest.raises(type(error)) as raised:
        decode_or_tile(decode, frames, tile=256, overlap=32, hop=4, oom_fallback=False)
    assert raised.value is error


def test_whole_decode_and_forced_tiles():
    frames = _frames(1, 3, 300, seed=4)
    decode, calls = _failing_above(300, torch.OutOfMemoryError("never raised"))
    samples, tiled = decode_or_tile(decode, frames, tile=256, overlap=32, hop=4,
                                    oom_fallback=True)
    assert not tiled and calls == [300]
    samples, tiled = decode_or_tile(decode, frames, tile=256, overlap=32, hop=4,
                                    oom_fallback=False, force_tiles=True)
    assert tiled and calls == [300, 256, 76]


def test_other_errors_are_not_out_of_memory():
    bad_shape = RuntimeError("Given groups=1, weight of size [8, 8, 7], expected input[1, 3, 9]")
    decode, calls = _failing_above(0, bad_shape)
    with pytest.raises(RuntimeError, match="groups=1"):
        decode_or_tile(decode, _frames(1, 3, 600), tile=256, overlap=32, hop=4,
                       oom_fallback=True)
    assert calls == [600] and not is_out_of_memory(bad_shape)


def test_a_failed_cpu_allocation_is_out_of_memory():
    try:  # 1 PiB: more than any address space, refused at once (no memory is touched)
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as error:
        assert is_out_of_memory(error), str(error)
    else:
        pytest.fail("a 1 PiB allocation succeeded")
