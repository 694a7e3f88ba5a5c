"""Cache slots: each request's own static KV caches, from a pool the engine holds.

A slot is the pair of caches one generation writes (the base LM's and the residual LM's), each
``max_length`` positions for one sequence, exactly the caches a model used to hold itself: a
request in a slot runs the same kernels on the same shapes as before, so its bits do not
depend on which slot it has or on what other slots hold. The pool allocates a slot the first
time it is needed (a process that serves one request at a time holds one) and keeps it for the
next request; ``engines.voxcpm.cache_slots`` bounds how many requests can be open at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from mizuoto.errors import EngineBusy
from mizuoto.runtime.busy_wait import busy_wait
from mizuoto_voxcpm.kv_cache import CacheFull, KVCache


@attrs.define(eq=False)
class CacheSlot:
    """One sequence's caches: ``lm`` (the base LM's) and ``residual`` (the residual LM's)."""

    lm: KVCache
    residual: KVCache

    @classmethod
    def allocate(cls, model, attention: str = "exact") -> CacheSlot:
        """Caches of ``max_length`` positions in the model's dtype, on its device."""
        kwargs = dict(device=model.device, dtype=model.dtype, attention=attention)
        length = model.config.max_length
        return cls(KVCache(model.base_lm.config, length, **kwargs),
                   KVCache(model.residual_lm.config, length, **kwargs))

    @property
    def has_room(self) -> bool:
        """Whether both LMs can take another step."""
        return self.lm.has_room and self.residual.has_room

    def rewind(self) -> None:
        """Discard the last step of both LMs (a step taken before the stop flag was read)."""
        self.lm.rewind()
        self.residual.rewind()

    def cache_full(self) -> CacheFull:
        return CacheFull(f"the model's context (max_length {self.lm.max_length}) is full")


#: How long a request waits for a slot another thread holds before EngineBusy (a library
#: call waits, as a call on a busy resource does; a caller that must not wait passes ``wait=0``)
SLOT_WAIT_SECONDS = 30.0


class CachePool:
    """Up to ``size`` cache slots for one model; ``first`` (the model's own slot, the one CUDA
    graphs are captured over) is handed out first. A request finding every slot held by other
    threads waits up to ``wait`` seconds for one to come back."""

    def __init__(self, model, *, size: int, attention: str, first: CacheSlot | None = None
                 ) -> None:
        if size < 1:
            raise ValueError(f"a cache pool needs at least one slot, got {size}")
        self._model = model
        self.size = size
        self.attention = attention
        self._free: list[CacheSlot] = [first] if first is not None else []
        self._allocated = len(self._free)
        self._guard = threading.Lock()
        self._returned = threading.Condition(self._guard)
        self._holders: dict[int, int] = {}  # id(slot) -> the thread that holds it
        self.wait = SLOT_WAIT_SECONDS

    @property
    def in_use(self) -> int:
        with self._guard:
            return self._allocated - len(self._free)

    @property
    def allocated(self) -> int:
        return self._allocated

    def reserve(self, count: int) -> None:
        """Allocate slots now until ``count`` exist (at most ``size``). A batching engine
        reserves a batch's worth at load: listeners that connect together would otherwise
        allocate theirs together, and the page faults of a few hundred MB serialize in the
        kernel (measured: 7 of 8 listeners admitted 0.1-0.7 s late)."""
        while True:
            with self._guard:
                if self._allocated >= min(count, self.size):
                    return
                self._allocated += 1
            try:
                slot = CacheSlot.allocate(self._model, self.attention)
                slot.lm.tensor.zero_()  # touch the pages now
                slot.residual.tensor.zero_()
            except BaseException:
                with self._guard:
                    self._allocated -= 1
                raise
            with self._guard:
                self._free.append(slot)

    def acquire(self, wait: float | None = None) -> CacheSlot:
        """A free slot (allocated on first need). When all are open, wait up to ``wait``
        seconds (default: the pool's ``wait``, or the caller's bound: a server waits none,
        see :mod:`mizuoto.runtime.busy_wait`) for another thread to give one back, then
        :class:`EngineBusy` naming the wait; at once when this thread holds them all (it
        cannot give one back while it waits)."""
        wait = busy_wait(self.wait) if wait is None else wait
        with self._guard:
            if not self._free and self._allocated >= self.size:
                me = threading.get_ident()
                others = any(holder != me for holder in self._holders.values())
                if not (others and wait > 0 and self._returned.wait_for(
                        lambda: bool(self._free), timeout=wait)):
                    waited = f"waited {wait:g} s; " if others and wait > 0 else ""
                    raise EngineBusy(
                        f"all {self.size} cache slots of this VoxCPM model are held by open "
                        f"requests ({waited}streams not yet finished or closed)",
                        "finish or close a stream first, or load the model with a larger "
                        "engines.voxcpm.cache_slots")
            if self._free:
                slot = self._free.pop(0)
                self._holders[id(slot)] = threading.get_ident()
                return slot
            self._allocated += 1
        try:
            slot = CacheSlot.allocate(self._model, self.attention)
        except BaseException:
            with self._guard:
                self._allocated -= 1
            raise
        with self._guard:
            self._holders[id(slot)] = threading.get_ident()
        return slot

    def release(self, slot: CacheSlot) -> None:
        """Give ``slot`` back; its contents are overwritten by the next prefill."""
        with self._guard:
            if any(slot is free for free in self._free):
                raise ValueError("this cache slot was already released")
            # the model's own slot first again: CUDA graphs replay over it
            self._free.insert(0 if slot is self._model.caches else len(self._free), slot)
            self._holders.pop(id(slot), None)
            self._returned.notify()

    @contextmanager
    def slot(self) -> Iterator[CacheSlot]:
        slot = self.acquire()
        try:
            yield slot
        finally:
            self.release(slot)
