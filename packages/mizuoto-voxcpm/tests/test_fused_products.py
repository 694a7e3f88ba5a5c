"""A fast profile's MiniCPM-4 (never exact): q/k/v and gate/up fused into one int8 product
each give the separate int8 products' bits; a decode step attending with each kv head's query
heads folded into rows equals torch's grouped-query call to rounding."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_lm import lm_config

from mizuoto.runtime.packed_int8 import PackedInt8Linear, pack_int8_linears, packed_int8_unavailable
from mizuoto_voxcpm.kv_cache import KVCache
from mizuoto_voxcpm.layer_fusion import (
    fold_query_heads,
    fuse_elementwise,
    fuse_products,
    patch_rows_only,
)
from mizuoto_voxcpm.minicpm4 import MiniCPM4

CONFIG = lm_config(64, 96, heads=8, kv_heads=2)


def _run(model: MiniCPM4, rows: int = 3, attention: str = "exact") -> list[torch.Tensor]:
    """A prefill, single steps against one cache and batched steps against ``rows`` caches
    (``attention``: theirs): every output."""
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(1, 11, CONFIG.hidden_size, generator=generator)
    hidden, pairs = model(embeds)
    outs = [hidden, *(tensor for pair in pairs for tensor in pair)]
    caches = [KVCache(CONFIG, 512, attention=attention) for _ in range(rows)]
    for cache in caches:
        cache.fill(pairs)
    for _ in range(3):
        outs.append(model.step(torch.randn(1, CONFIG.hidden_size, generator=generator),
                               caches[0]))
    for _ in range(3):
        outs.append(model.step_rows(torch.randn(rows, CONFIG.hidden_size, generator=generator),
                                    caches))
    return outs


@pytest.mark.skipif(packed_int8_unavailable() is not None, reason=str(packed_int8_unavailable()))
@torch.inference_mode()
def test_fused_int8_products_give_the_separate_products_bits():
    torch.manual_seed(0)
    separate = MiniCPM4(CONFIG)
    fused = copy.deepcopy(separate)
    assert fuse_products([fused], PackedInt8Linear.fused) == 2 * CONFIG.num_hidden_layers
    assert pack_int8_linears([separate]) == 7 * CONFIG.num_hidden_layers
    assert pack_int8_linears([fused]) == 2 * CONFIG.num_hidden_layers  # o_proj, down_proj
    attention, mlp = fused.layers[0].self_attn, fused.layers[0].mlp
    assert attention.qkv_proj.split_sizes == (64, 16, 16)
    assert mlp.gate_up_proj.split_sizes == (96, 96)
    assert not hasattr(attention, "q_proj") and not hasattr(mlp, "up_proj")
    for a, b in zip(_run(separate), _run(fused), strict=True):
        assert torch.equal(a, b)


@torch.inference_mode()
def test_folded_query_heads_equal_grouped_query_attention_to_rounding():
    torch.manual_seed(0)
    plain = MiniCPM4(CONFIG)
    folded = copy.deepcopy(plain)
    assert fold_query_heads([folded]) == CONFIG.num_hidden_layers
    assert folded.layers[0].self_attn.folded_heads and not plain.layers[0].self_attn.folded_heads
    expected, got = _run(plain), _run(folded)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mup", [True, False])
@torch.inference_mode()
def test_the_fast_profiles_step_equals_the_exact_arithmetic_to_rounding(mup):
    """Folded heads over the filled positions only (unmasked, not copied), RMSNorm as one
    call, RoPE on q and k together and the scaled residual add as one operation: every
    prefill, step and batched-step output within rounding of the exact model's, scaled
    residuals (muP) or not."""
    config = lm_config(64, 96, heads=8, kv_heads=2, use_mup=mup)
    torch.manual_seed(0)
    plain = MiniCPM4(config)
    fast = copy.deepcopy(plain)
    fold_query_heads([fast])
    assert fuse_elementwise([fast]) == config.num_hidden_layers
    layer = fast.layers[0]
    assert layer.fused_add and layer.self_attn.fused_rope and layer.input_layernorm.fused
    assert fast.norm.fused and not plain.norm.fused and not plain.layers[0].fused_add
    assert fast.rope_emb.sign_flipped and not plain.rope_emb.sign_flipped
    expected, got = _run(plain), _run(fast, attention="fast")
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("separate_condition", [False, True])
@torch.inference_mode()
def test_a_fast_dit_computes_the_patch_positions_only_in_its_last_layer(separate_condition):
    """``patch_rows_only``: the last layer's queries, o_proj and MLP over the patch's
    positions only (after every position's keys and values): the velocity within rounding of
    the whole layer's, alone and as a batch of guided pairs; not causal only."""
    from mizuoto_voxcpm.local_dit import LocalDiT

    config = lm_config(64, 96, heads=8, kv_heads=2, layers=3)
    torch.manual_seed(0)
    whole = LocalDiT(config, 16, separate_condition=separate_condition)
    trimmed = copy.deepcopy(whole)
    assert patch_rows_only([trimmed]) == 1
    assert trimmed.patch_rows_only and not whole.patch_rows_only
    generator = torch.Generator().manual_seed(3)
    for rows, pairs in ((2, False), (6, True)):
        x = torch.randn(rows, 16, 4, generator=generator)
        mu = torch.randn(rows, 64 * (2 if separate_condition else 1), generator=generator)
        cond = torch.randn(rows, 16, 3, generator=generator)
        t, dt = torch.rand(rows, generator=generator), torch.rand(rows, generator=generator)
        expected = whole(x, mu, t, cond, dt, pairs=pairs)
        got = trimmed(x, mu, t, cond, dt, pairs=pairs)
        assert got.shape == expected.shape == x.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="causal mask"):
        trimmed.decoder(torch.randn(1, 5, 64), causal=True, last=2)


@torch.inference_mode()
@pytest.mark.parametrize("prefill", [0, 11])
def test_one_traced_decode_step_serves_every_position_with_the_fast_steps_bits(prefill):
    """``trace_steps``: a single-sequence step against a ``fast`` cache replays one trace at
    every position (the filled positions are its varying size), proven where it was made
    and confirmed at the next position: the fast step's bits, the same cache writes and
    position, from an empty cache or after a prefill, past what a fixed span would hold."""
    config = lm_config(64, 96, heads=8, kv_heads=2)
    torch.manual_seed(0)
    plain = MiniCPM4(config)
    fold_query_heads([plain])
    fuse_elementwise([plain])
    traced = copy.deepcopy(plain)
    traced.trace_steps()
    generator = torch.Generator().manual_seed(1)
    caches = {name: KVCache(config, 64, attention="fast") for name in ("plain", "traced")}
    if prefill:
        _, pairs = plain(torch.randn(1, prefill, config.hidden_size, generator=generator))
        for cache in caches.values():
            cache.fill(pairs)
    steps = 40
    for _ in range(steps):
        embed = torch.randn(1, config.hidden_size, generator=generator)
        expected = plain.step(embed, caches["plain"])
        got = traced.step(embed, caches["traced"])
        assert torch.equal(got, expected)
    assert traced.shape_traces.traced == 1 and traced.shape_traces.eager_shapes == {}
    end = prefill + steps
    assert caches["traced"].length == caches["plain"].length == end
    assert int(caches["traced"].position) == int(caches["plain"].position) == end
    assert torch.equal(caches["traced"].tensor, caches["plain"].tensor)
    assert caches["traced"].tensor[..., end:, :].abs().sum() == 0  # nothing past the steps


@torch.inference_mode()
def test_a_cache_with_exact_attention_steps_eagerly_under_traces():
    """The traced step attends over the filled positions, unmasked: a cache whose attention
    is ``exact`` (spans of 256, masked: upstream's bits) keeps the eager step."""
    config = lm_config(64, 96, heads=8, kv_heads=2)
    torch.manual_seed(0)
    plain = MiniCPM4(config)
    traced = copy.deepcopy(plain)
    traced.trace_steps()
    caches = {name: KVCache(config, 64, attention="exact") for name in ("plain", "traced")}
    embed = torch.randn(1, config.hidden_size)
    for _ in range(3):
        assert torch.equal(traced.step(embed, caches["traced"]),
                           plain.step(embed, caches["plain"]))
    assert traced.shape_traces.traced == 0
