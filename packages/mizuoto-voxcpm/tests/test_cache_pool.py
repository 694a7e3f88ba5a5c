"""The cache pool: each open request's own slot, taken and given back by the core scheduler's
stepping thread only (no lock of its own). Waiting for a slot is waiting for a row of the
scheduler (core tests/test_scheduler.py); the pool itself never waits."""

from __future__ import annotations

import types

import pytest

from mizuoto.errors import EngineBusy
from mizuoto_voxcpm.cache_pool import CachePool


def _pool(size=2):
    slots = [object() for _ in range(size)]
    pool = CachePool(types.SimpleNamespace(caches=slots[0]), size=size, attention="exact",
                     first=slots[0])
    pool._free.extend(slots[1:])
    pool._allocated = size
    return pool, slots


def test_the_models_own_slot_goes_out_first_and_comes_back_first():
    pool, (own, other) = _pool()
    assert pool.acquire() is own and pool.acquire() is other and pool.in_use == 2
    pool.release(other)
    pool.release(own)
    assert pool.acquire() is own  # CUDA graphs replay over it


def test_every_slot_held_is_engine_busy_naming_the_setting():
    pool, _ = _pool(size=1)
    held = pool.acquire()
    with pytest.raises(EngineBusy, match=r"held by open requests") as info:
        pool.acquire()
    assert "engines.voxcpm.cache_slots" in info.value.fix
    pool.release(held)
    with pytest.raises(ValueError, match="already released"):
        pool.release(held)
