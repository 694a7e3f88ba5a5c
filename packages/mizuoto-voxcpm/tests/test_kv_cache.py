"""A static cache refilled by the next request is exactly a new cache filled with its prompt:
the positions an earlier request wrote are zeros again (only those are zeroed)."""

from __future__ import annotations

import torch
from tiny_lm import lm_config

from mizuoto_voxcpm.kv_cache import KVCache
from mizuoto_voxcpm.minicpm4 import MiniCPM4

CONFIG = lm_config(32, 64, heads=4, kv_heads=2)


def _prefill(model: MiniCPM4, length: int, seed: int) -> list:
    embeds = torch.randn(1, length, CONFIG.hidden_size, generator=torch.Generator().manual_seed(seed))
    return model(embeds, causal=True)[1]


@torch.inference_mode()
def test_a_refilled_cache_is_a_new_cache():
    torch.manual_seed(0)
    model = MiniCPM4(CONFIG)
    cache = KVCache(CONFIG, 64)
    cache.fill(_prefill(model, 12, 1))
    for _ in range(9):  # a request's steps, one of them rewound
        model.step(torch.randn(1, CONFIG.hidden_size), cache)
    cache.rewind()
    cache.tensor[:, :, :, :, 20] = float("nan")  # what a broken request might leave behind
    cache.next_position()  # position 20 is claimed (written) again
    for length in (5, 30, 3):  # shorter than what was written, longer, shorter again
        pairs = _prefill(model, length, length)
        cache.fill(pairs)
        fresh = KVCache(CONFIG, 64)
        fresh.fill(pairs)
        assert torch.equal(cache.tensor, fresh.tensor), length
        assert cache.length == fresh.length == length
        model.step(torch.randn(1, CONFIG.hidden_size), cache)
