"""Cache slots: each request's own static KV caches, from a pool the engine holds.

A slot is the pair of caches one generation writes (the base LM's and the residual LM's), each
``max_length`` positions for one sequence, exactly the caches a model used to hold itself: a
request in a slot runs the same kernels on the same shapes as before, so its bits do not
depend on which slot it has or on what other slots hold. The pool allocates a slot the first
time it is needed (a process that serves one request at a time holds one) and keeps it for the
next request; ``engines.voxcpm.cache_slots`` bounds how many requests can be open at once
(the core scheduler's rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from mizuoto.errors import EngineBusy
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


class CachePool:
    """Up to ``size`` cache slots for one model; ``first`` (the model's own slot, the one CUDA
    graphs are captured over) is handed out first. No lock: only the core scheduler's stepping
    thread takes and gives back slots (or its lock's holder while no step runs), and it opens
    no more rows than there are slots (the engine's ``max_rows``)."""

    def __init__(self, model, *, size: int, attention: str, first: CacheSlot | None = None
                 ) -> None:
        if size < 1:
            raise ValueError(f"a cache pool needs at least one slot, got {size}")
        self._model = model
        self.size = size
        self.attention = attention
        self._free: list[CacheSlot] = [first] if first is not None else []
        self._allocated = len(self._free)

    @property
    def in_use(self) -> int:
        return self._allocated - len(self._free)

    @property
    def allocated(self) -> int:
        return self._allocated

    def reserve(self, count: int) -> None:
        """Allocate slots now until ``count`` exist (at most ``size``). A batching engine
        reserves a batch's worth at load: listeners that connect together would otherwise
        allocate theirs in their first steps, and the page faults of a few hundred MB take
        their first audio's time."""
        while self._allocated < min(count, self.size):
            slot = CacheSlot.allocate(self._model, self.attention)
            slot.lm.tensor.zero_()  # touch the pages now
            slot.residual.tensor.zero_()
            self._free.append(slot)
            self._allocated += 1

    def acquire(self) -> CacheSlot:
        """A free slot (allocated on first need); :class:`EngineBusy` naming
        ``engines.voxcpm.cache_slots`` when all are held."""
        if self._free:
            return self._free.pop(0)
        if self._allocated >= self.size:
            raise EngineBusy(f"all {self.size} cache slots of this VoxCPM model are held by "
                             "open requests (streams not yet finished or closed)",
                             "finish or close a stream first, or load the model with a larger "
                             "engines.voxcpm.cache_slots")
        slot = CacheSlot.allocate(self._model, self.attention)
        self._allocated += 1
        return slot

    def release(self, slot: CacheSlot) -> None:
        """Give ``slot`` back; its contents are overwritten by the next prefill."""
        if any(slot is free for free in self._free):
            raise ValueError("this cache slot was already released")
        # the model's own slot first again: CUDA graphs replay over it
        self._free.insert(0 if slot is self._model.caches else len(self._free), slot)

    @contextmanager
    def slot(self) -> Iterator[CacheSlot]:
        slot = self.acquire()
        try:
            yield slot
        finally:
            self.release(slot)
