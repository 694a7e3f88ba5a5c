"""On CPU a decoding step attends over the static cache only up to the next multiple of 256
past the current length; the masked tail must add exact zeros. Proven here at the released
models' attention shapes (16 query heads, 2 KV heads, head dim 64 and 128, caches of 4096 and
8192 positions), in float32 and bfloat16, against attending over the whole cache (upstream)."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import lm_config

from mizuoto_voxcpm.kv_cache import ATTEND_SPAN_MULTIPLE, KVCache, RowsStep, RowStep
from mizuoto_voxcpm.minicpm4 import Attention


def _config(hidden: int, head_dim: int):
    assert hidden // 16 == head_dim
    return lm_config(hidden, 4 * hidden, heads=16, kv_heads=2, layers=1, max_positions=32768)


def _filled(span: int, position: int) -> torch.Tensor:
    return (torch.arange(span) <= position).view(1, 1, 1, -1)


POSITIONS = (0, 1, 100, 255, 256, 257, 511, 700, 1023, 2000, 3000, 4095)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hidden", "head_dim", "max_length"),
                         [(1024, 64, 4096), (2048, 128, 8192)])
@torch.inference_mode()  # as generation runs
def test_span_is_bit_exact(hidden, head_dim, max_length, dtype):
    config = _config(hidden, head_dim)
    torch.manual_seed(0)
    attention = Attention(config).to(dtype)
    cache = KVCache(config, max_length, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 2, max_length, head_dim, generator=generator).to(dtype)
    values = torch.randn(1, 2, max_length, head_dim, generator=generator).to(dtype)
    mismatches = []
    for position in (*POSITIONS, max_length - 1):
        cache.tensor.zero_()
        cache.tensor[0, 0, :, :, :position] = keys[:, :, :position]
        cache.tensor[1, 0, :, :, :position] = values[:, :, :position]
        hidden_state = torch.randn(1, hidden, generator=generator).to(dtype)
        cos = torch.randn(1, head_dim, generator=generator)
        rope = (cos, torch.randn(1, head_dim, generator=generator))
        span = cache.attend_span(position)
        assert span % ATTEND_SPAN_MULTIPLE == 0 and span > position
        index = torch.tensor([position])
        short = attention.step(hidden_state, rope, index, span, _filled(span, position),
                               cache.layer(0))
        full = attention.step(hidden_state, rope, index, max_length,
                              _filled(max_length, position), cache.layer(0))
        if not torch.equal(short, full):
            mismatches.append(position)
    assert mismatches == []


def test_span_rounds_up_and_caps():
    config = _config(1024, 64)
    cache = KVCache(config, 600)
    assert [cache.attend_span(p) for p in (0, 255, 256, 511, 512, 599)] == \
        [256, 256, 512, 512, 600, 600]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hidden", "head_dim", "max_length"),
                         [(1024, 64, 4096), (2048, 128, 8192)])
@torch.inference_mode()
def test_rows_attending_together_equal_each_row_alone(hidden, head_dim, max_length, dtype):
    """A batched step's one attention call over rows at unequal positions (gathered to the
    longest span, one mask) gives each row the bits of its own call over its own span, and
    hands back the keys and values that row's own step writes to its cache."""
    config = _config(hidden, head_dim)
    torch.manual_seed(0)
    attention = Attention(config).to(dtype)
    generator = torch.Generator().manual_seed(2)
    positions = [0, 100, 255, 256, 700, 2000]
    caches = []
    for position in positions:
        cache = KVCache(config, max_length, dtype=dtype)
        cache.tensor[:, 0, :, :, :position] = torch.randn(
            2, 1, 2, position, head_dim, generator=generator).to(dtype)
        caches.append(cache)
    hidden_states = torch.randn(len(positions), hidden, generator=generator).to(dtype)
    rope = (torch.randn(len(positions), 1, 1, head_dim, generator=generator),
            torch.randn(len(positions), 1, 1, head_dim, generator=generator))
    index = torch.tensor(positions)
    spans = [cache.attend_span(position) for cache, position in zip(caches, positions, strict=True)]
    span = max(spans)
    mask = (torch.arange(span).view(1, -1) <= index.view(-1, 1)).view(-1, 1, 1, span)
    together, (keys, values) = attention.step_rows(
        hidden_states, rope, RowsStep([cache.layer(0) for cache in caches], index, span, mask))
    each, written = attention.step_rows(
        hidden_states, rope,
        [RowStep(index[i:i + 1], spans[i], _filled(spans[i], p), caches[i].layer(0))
         for i, p in enumerate(positions)])
    assert written is None
    assert torch.equal(together, each)
    for row, (cache, position) in enumerate(zip(caches, positions, strict=True)):
        assert torch.equal(keys[row, :, 0], cache.tensor[0, 0, 0, :, position])
        assert torch.equal(values[row, :, 0], cache.tensor[1, 0, 0, :, position])
