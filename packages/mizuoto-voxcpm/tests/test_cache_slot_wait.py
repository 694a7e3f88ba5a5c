"""A call finding every cache slot held by other threads waits for one (bounded), as a library
user expects, then EngineBusy naming the wait; a thread holding them all itself is told at once
(issue 33, 4)."""

from __future__ import annotations

import threading
import types

import pytest

from mizuoto.errors import EngineBusy
from mizuoto.runtime.busy_wait import waiting_at_most
from mizuoto_voxcpm.cache_pool import CachePool


def _pool(size=1):
    slots = [object() for _ in range(size)]
    pool = CachePool(types.SimpleNamespace(caches=slots[0]), size=size, attention="exact",
                     first=slots[0])
    pool._free.extend(slots[1:])
    pool._allocated = size
    return pool


def _held_elsewhere(pool):
    """A slot taken by another thread, and the event that makes it give the slot back."""
    taken, give_back = threading.Event(), threading.Event()

    def hold():
        slot = pool.acquire()
        taken.set()
        give_back.wait()
        pool.release(slot)

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    return thread, give_back


def test_a_call_waits_for_the_slot_another_thread_gives_back():
    pool = _pool()
    thread, give_back = _held_elsewhere(pool)
    threading.Timer(0, give_back.set).start()  # given back while this thread waits
    slot = pool.acquire(wait=600)
    thread.join()
    assert pool.in_use == 1
    pool.release(slot)


def test_past_the_wait_engine_busy_names_it():
    pool = _pool()
    thread, give_back = _held_elsewhere(pool)
    with pytest.raises(EngineBusy, match=r"waited 0.01 s") as info:
        pool.acquire(wait=0.01)
    assert "cache_slots" in info.value.fix
    give_back.set()
    thread.join()


def test_a_thread_holding_every_slot_is_told_at_once():
    pool = _pool()
    held = pool.acquire()
    with pytest.raises(EngineBusy, match=r"held by open requests \(streams"):
        pool.acquire(wait=600)  # no other thread could give one back: no wait
    pool.release(held)
    assert pool.acquire(wait=0) is held


def test_a_server_job_is_told_at_once():
    """mizuoto serve runs its jobs inside waiting_at_most(0): its 429 comes without a wait."""
    pool = _pool()
    pool.wait = 600  # a library call would wait this long
    thread, give_back = _held_elsewhere(pool)
    with waiting_at_most(0), pytest.raises(EngineBusy) as info:
        pool.acquire()
    assert "waited" not in str(info.value)
    give_back.set()
    thread.join()
