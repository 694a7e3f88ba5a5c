"""Which models stay loaded (:class:`ModelPool`), and when a request may pin one
(:meth:`ModelPool.pin`, :func:`pin_for_request`)."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

from mizuoto.serve.errors import APIError, ClientGone, unavailable
from mizuoto.serve.jobs import Job, Pin


class PooledModel(Protocol):
    """What the pool reads of a model's worker (:class:`~mizuoto.serve.worker.ModelWorker`)."""

    name: str
    engine: object | None
    engine_bytes: int
    last_used: float
    state: str
    pins: int
    queue_size: int
    pool: ModelPool | None

    def evict(self) -> bool: ...
    def depth(self) -> int: ...
    def submit_check(self) -> None: ...
    def queue_full(self) -> APIError: ...


class ModelPool:
    """Which models stay loaded: at most ``max_loaded`` of them, and at most ``memory_budget``
    bytes of weights (parameters and buffers).

    - A model is unloaded only when idle: nothing running or queued, and no request pinned to
      it (:class:`Pin`: a request holds its model from arrival to the end of its job, so a
      model loaded for waiting requests stays until they have run).
    - An unloaded model that has requests loads once there is room (:meth:`admit`, on its
      worker thread): idle models are unloaded, least recently used first; while every loaded
      model is busy it waits, and loads waiting for room are served in arrival order.
    - While a load waits for room, new requests for the loaded models wait their turn
      (:meth:`turn`) instead of pinning them: the busy models drain, the waiting one loads and
      serves its requests, then the others come back. Each switch serves every request queued
      for the model, so models alternate in batches instead of thrashing, and none starves.
    - After a load, idle models are unloaded until the limits hold; a busy model is never
      unloaded, so a memory budget can be exceeded while a model larger than the room left is
      the only one that fits the count.
    """

    def __init__(self, max_loaded: int | None = None, memory_budget: int | None = None) -> None:
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget
        self.workers: list[PooledModel] = []
        self._lock = threading.Condition()
        self._waiting: list[PooledModel] = []  # loads waiting for room, in arrival order
        self._admitted: set[PooledModel] = set()  # loads under way
        # requests waiting for their turn to pin each model (:meth:`pin`); only the event
        # loop's thread changes it
        self._requests_waiting: Counter = Counter()

    def add(self, worker: PooledModel, *, loading: bool = False) -> None:
        """Manage ``worker``; ``loading``: it loads at start, and counts as loaded from now."""
        self.workers.append(worker)
        if loading:
            self._admitted.add(worker)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def pinned(self, worker: PooledModel, change: int) -> None:
        with self._lock:
            worker.pins += change
            self._lock.notify_all()

    def turn(self, worker: PooledModel) -> Pin | None:
        """A pin on ``worker`` if a request may take one now; None while it must wait (the
        model is loaded, and another model waits for its room)."""
        with self._lock:
            if worker.engine is not None and any(w is not worker for w in self._waiting):
                return None
            return Pin(worker)

    async def pin(self, worker: PooledModel, disconnected: Callable[[], Awaitable[bool]]) -> Pin:
        """A pin on ``worker`` for a request, once its :meth:`turn` comes (on the event loop,
        polled); a 429 when the model's queue and the requests already waiting fill its queue
        size; :class:`ClientGone` once ``disconnected()`` says the client left."""
        pin = self.turn(worker)
        if pin is not None:
            return pin
        if worker.depth() + self._requests_waiting[worker] >= worker.queue_size:
            raise worker.queue_full()
        self._requests_waiting[worker] += 1
        try:
            while (pin := self.turn(worker)) is None:
                worker.submit_check()
                if await disconnected():
                    raise ClientGone
                await asyncio.sleep(0.05)
        finally:
            self._requests_waiting[worker] -= 1
        return pin

    def _resident(self, worker: PooledModel) -> bool:
        return worker.engine is not None or worker in self._admitted

    def _room_for(self, incoming: PooledModel) -> bool:
        others = [w for w in self.workers if w is not incoming and self._resident(w)]
        if self.max_loaded is not None and len(others) >= self.max_loaded:
            return False
        # a model never loaded has no known size: it gets the room, and the limits are
        # applied once it has loaded (:meth:`loaded`)
        return self.memory_budget is None or not others or \
            sum(w.engine_bytes for w in others) + incoming.engine_bytes <= self.memory_budget

    def admit(self, worker: PooledModel, job: Job) -> bool:
        """Return once ``worker`` may load its model for ``job`` (on its thread, before
        loading): idle models are unloaded to make room, else it waits its turn. False if
        ``job`` is cancelled meanwhile; an :class:`APIError` (503) if the worker stops."""
        evicted: list[PooledModel] = []
        try:
            with self._lock:
                self._waiting.append(worker)
                try:
                    while True:
                        if worker.state == "stopped":
                            raise unavailable("the server is shutting down", "shutting_down")
                        if job.cancelled:
                            return False
                        if self._waiting[0] is worker and self._make_room(worker, evicted):
                            self._admitted.add(worker)
                            return True
                        self._lock.wait(0.25)  # woken by a release; the timeout covers the rest
                finally:
                    self._waiting.remove(worker)
                    self._lock.notify_all()
        finally:
            if evicted:
                gc.collect()

    def admitted_done(self, worker: PooledModel) -> None:
        """``worker``'s load has ended (loaded or failed)."""
        with self._lock:
            self._admitted.discard(worker)
            self._lock.notify_all()

    def _make_room(self, incoming: PooledModel, evicted: list[PooledModel]) -> bool:
        for other in sorted((w for w in self.workers if w is not incoming
                             and w.engine is not None), key=lambda w: w.last_used):
            if self._room_for(incoming):
                break
            if other.evict():
                evicted.append(other)
        return self._room_for(incoming)

    def _over(self) -> bool:
        loaded = [w for w in self.workers if w.engine is not None]
        if self.max_loaded is not None and len(loaded) > self.max_loaded:
            return True
        return self.memory_budget is not None and \
            sum(w.engine_bytes for w in loaded) > self.memory_budget

    def loaded(self, worker: PooledModel) -> None:
        """``worker`` has loaded its model: unload others, least recently used first."""
        self.rebalance(keep=worker)

    def rebalance(self, keep: PooledModel | None = None) -> None:
        """Unload idle models, least recently used first, until the limits hold."""
        evicted = False
        with self._lock:
            others = sorted((w for w in self.workers if w is not keep and w.engine is not None),
                            key=lambda w: w.last_used)
            for other in others:
                if not self._over():
                    break
                evicted = other.evict() or evicted
            self._lock.notify_all()
        if evicted:
            gc.collect()


async def pin_for_request(worker: PooledModel, disconnected: Callable[[], Awaitable[bool]]
                          ) -> Pin:
    """A pin holding ``worker``'s model loaded for a request, taken when its turn comes
    (:meth:`ModelPool.pin`; at once without a pool); a 503 unless the model takes requests."""
    worker.submit_check()
    if worker.pool is None:
        return Pin(worker)
    return await worker.pool.pin(worker, disconnected)
