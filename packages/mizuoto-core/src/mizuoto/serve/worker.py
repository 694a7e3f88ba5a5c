"""One worker thread per loaded model, fed by a bounded queue: the only place model code runs.

The event loop submits a :class:`Job` and reads what it emits (audio chunks, a voice, an
error, then :data:`DONE`) from an ``asyncio.Queue``. Requests for different models run in
parallel on their workers; requests for one model run one after the other, in arrival order
(the engine contract serializes an engine's calls anyway, a stream holding the engine from its
first chunk to its last). A job whose client went away is skipped if still queued, and stopped
at the engine's next progress report or chunk if running.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable

from mizuoto.runtime.busy_wait import waiting_at_most
from mizuoto.serve.batching import Lanes
from mizuoto.serve.errors import APIError, from_mizuoto, unavailable, without_paths

log = logging.getLogger("mizuoto.serve")

#: Emitted last by every job.
DONE = object()
#: Items (audio chunks) a job may have waiting for its client: a client that reads slowly
#: slows its own generation instead of piling its audio up in the server's memory.
MAX_BUFFERED = 8


class Cancelled(Exception):
    """The client went away: the job stops where it is."""


class Pin:
    """A request's hold on its model: while any pin is held the pool does not unload the model.
    Taken when the request arrives, so that the model it waits for stays loaded until its job
    has run; handed to that job (``Job(pin=...)``), which releases it when it ends."""

    def __init__(self, worker: ModelWorker) -> None:
        self._worker = worker
        self._held = True
        worker._pinned(+1)

    def release(self) -> None:
        """Let go (once; later calls do nothing)."""
        if self._held:
            self._held = False
            self._worker._pinned(-1)


class Job:
    """Work for a model's worker: ``run(engine, job)`` executes on the worker thread and calls
    :meth:`emit` for each result; the event loop awaits :attr:`items`. ``pin`` (a request's
    :class:`Pin`) is released when the job ends, run or skipped."""

    def __init__(self, run: Callable, loop: asyncio.AbstractEventLoop, *,
                 pin: Pin | None = None) -> None:
        self._run = run
        self._loop = loop
        self._pin = pin
        self._items: asyncio.Queue = asyncio.Queue()  # private: read with :meth:`get`, which makes room
        self._room = threading.Semaphore(MAX_BUFFERED)
        self._cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.audio_seconds = 0.0

    def emit(self, item) -> None:
        """Send ``item`` to the event loop; waits (on the worker's thread) while
        :data:`MAX_BUFFERED` items wait for the client, unless the job is cancelled."""
        while not self._room.acquire(timeout=0.1):
            if self._cancelled.is_set():
                break
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def get(self):
        """The next item emitted (on the event loop), which makes room for another."""
        item = await self._items.get()
        self._room.release()
        return item

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self, _progress=None) -> None:
        """Raise :class:`Cancelled` once the job is cancelled; also the engine's progress
        callback, so that a generation stops within one sampling step or patch."""
        if self._cancelled.is_set():
            raise Cancelled

    def run(self, engine) -> None:
        self._run(engine, self)

    def finish(self) -> None:
        """The job has ended: :data:`DONE` is sent and the model's pin released."""
        self.emit(DONE)
        self.release()

    def release(self) -> None:
        """Release the model's pin (the job has ended, or will never run)."""
        if self._pin is not None:
            self._pin.release()


class ModelWorker:
    """Owns one model on its own thread and runs that model's jobs one at a time.

    ``state``: ``loading``, ``ready``, ``unloaded`` (not loaded yet, or evicted by the
    :class:`ModelPool`: the next job loads it again), ``failed`` (``error`` says why) or
    ``stopped``. ``preload`` loads the model when the thread starts, else on its first job.
    ``shared_lock`` (benchmarks only) makes every worker take one lock around each job: the
    single-global-lock server this design is measured against.
    """

    def __init__(self, name: str, model: str, *, load: Callable[[], object], queue_size: int,
                 metrics=None, shared_lock: threading.Lock | None = None,
                 pool: ModelPool | None = None, preload: bool = True,
                 max_batch: int = 1) -> None:
        self.name = name
        # --max-batch: jobs run on lanes, several at once (mizuoto.serve.batching)
        self._lanes = Lanes(name, max_batch) if max_batch > 1 else None
        self.model = model
        self._load = load
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self._metrics = metrics
        self._shared_lock = shared_lock
        self._pool = pool
        self._preload = preload
        self._running: Job | None = None
        self.pins = 0  # requests holding the model loaded (:class:`Pin`)
        self.waiting = 0  # requests waiting for their turn to pin it (:meth:`ModelPool.turn`)
        # held by the worker while it loads or runs a job: the pool evicts only an idle model
        self._engine_lock = threading.Lock()
        self.engine = None
        self.engine_name: str | None = None  # kept once known, also while unloaded
        self.engine_bytes = 0
        self.last_used = 0.0
        self.loads = 0
        self.state = "loading" if preload else "unloaded"
        self.error: BaseException | None = None
        self.loaded = threading.Event()  # set once the first load ended (or was not asked)
        if not preload:
            self.loaded.set()
        self._thread = threading.Thread(target=self._main, name=f"mizuoto-model-{name}",
                                        daemon=True)
        if pool is not None:
            pool.add(self, loading=preload)

    def start(self) -> None:
        self._thread.start()

    def depth(self) -> int:
        """Jobs queued or running."""
        return self._queue.qsize() + (self._running is not None) + self._lane_jobs()

    def _lane_jobs(self) -> int:
        return self._lanes.active if self._lanes is not None else 0

    def _pinned(self, change: int) -> None:
        if self._pool is not None:  # without a pool nothing is unloaded: nothing to count
            self._pool.pinned(self, change)

    def submit_check(self) -> None:
        """An :class:`APIError` (503) unless the model takes requests (loaded or loadable)."""
        if self.state == "loading" and not self.loaded.is_set():
            raise unavailable(f"model {self.name!r} is still loading", "model_loading")
        if self.state == "failed":
            raise unavailable(f"model {self.name!r} failed to load: "
                              f"{without_paths(str(self.error))}", "model_unavailable", 60)
        if self.state == "stopped":
            raise unavailable("the server is shutting down", "shutting_down")

    def submit(self, job: Job) -> None:
        """Queue ``job``; an :class:`APIError` when the model cannot take it now (the job's
        pin is then released: the job will not run)."""
        try:
            self.submit_check()
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise self.queue_full() from None
        except BaseException:
            job.release()
            raise

    def queue_full(self) -> APIError:
        """The 429 for a request that finds the queue full."""
        return APIError(429, f"model {self.name!r} has {self.queue_size} requests waiting: "
                        "try again shortly", type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": "1"})

    @property
    def pool(self) -> ModelPool | None:
        return self._pool

    def evict(self) -> bool:
        """Unload the model if it is idle (nothing running, queued or pinned); True if it was.
        The memory returns at the caller's next ``gc.collect()`` (:class:`ModelPool` runs it
        once it has let go of its lock, which the event loop takes too)."""
        if self.pins or not self._engine_lock.acquire(blocking=False):
            return False
        try:
            if self.engine is None or self._running is not None or self._lane_jobs() \
                    or not self._queue.empty() or self.pins:
                return False
            self.engine = None
            self.engine_bytes = 0
            self.state = "unloaded"
        finally:
            self._engine_lock.release()
        log.info("model %s unloaded (least recently used)", self.name)
        return True

    def stop(self, timeout: float) -> None:
        """Take no more jobs, cancel queued ones, let the running one finish within
        ``timeout`` seconds."""
        self.state = "stopped"
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(unavailable("the server is shutting down", "shutting_down"))
                job.finish()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        deadline = time.monotonic() + timeout
        if self._pool is not None:
            self._pool.wake()  # a load waiting for room gives up
        self._thread.join(timeout)
        if self._lanes is not None:
            self._lanes.wait_idle(max(0.0, deadline - time.monotonic()))

    def _load_engine(self) -> None:
        """Load the model (on this thread, holding the engine lock); raises on failure."""
        self.state = "loading"
        try:
            engine = self._load()
            self.engine, self.engine_bytes = engine, _engine_bytes(engine)
            self.engine_name = getattr(engine, "name", None)
        except BaseException as exc:  # reported to every request for this model
            self.engine, self.error, self.state = None, exc, "failed"
            log.error("model %s failed to load: %s", self.name, exc)
            raise
        self.loads += 1
        self.last_used = time.monotonic()
        if self.state == "loading":
            self.state = "ready"
        log.info("model %s ready (%s)", self.name, self.model)

    def _main(self) -> None:
        if self._preload:
            try:
                with self._engine_lock:
                    self._load_engine()
            except BaseException:
                return
            finally:
                self.loaded.set()
                if self._pool is not None:
                    self._pool.admitted_done(self)
            if self._pool is not None:
                self._pool.loaded(self)
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._running = job
            self.last_used = time.monotonic()  # at the start too: the client may be done first
            on_lane = False  # a lane's job finishes on its lane
            try:
                with self._engine_lock:
                    if self.engine is None and not job.cancelled and not self._reload(job):
                        continue
                    if self._lanes is None:
                        self._execute(job)
                if self._lanes is not None:
                    self._lanes.run(lambda job=job: self._execute_on_lane(job))
                    on_lane = True
            finally:
                self._running = None
                if not on_lane:
                    job.finish()
            if self._pool is not None:  # a model busy when another loaded may go now
                self._pool.rebalance()

    def _execute_on_lane(self, job: Job) -> None:
        """``--max-batch``: one of the jobs running at once (mizuoto.serve.batching)."""
        try:
            self._execute(job)
        finally:
            job.finish()
        if self._pool is not None:
            self._pool.rebalance()

    def _reload(self, job: Job) -> bool:
        """Load the unloaded model for ``job``, once the pool has room (it waits for its
        turn); False, with the error sent to ``job``, when it cannot."""
        try:
            if self._pool is not None and not self._pool.admit(self, job):
                return False  # the client left while the load waited for room
            self._load_engine()
        except BaseException as exc:
            job.emit(exc if isinstance(exc, APIError) else unavailable(
                f"model {self.name!r} failed to load: {exc}", "model_unavailable", 60))
            return False
        finally:
            if self._pool is not None:
                self._pool.admitted_done(self)
        if self._pool is not None:
            self._pool.loaded(self)
        return True

    def _execute(self, job: Job) -> None:
        started = time.monotonic()
        try:
            if job.cancelled:
                raise Cancelled
            # a full engine answers 429 at once: the library's bounded wait is not a server's
            with self._shared_lock or contextlib.nullcontext(), waiting_at_most(0):
                job.run(self.engine)
        except Cancelled:
            if self._metrics is not None:
                self._metrics.cancelled(self.name)
            log.info("model %s: request cancelled (the client went away)", self.name)
        except BaseException as exc:  # sent to the client; logged with its traceback if unnamed
            job.emit(exc)
            if not isinstance(exc, APIError) and from_mizuoto(exc).status >= 500:
                log.exception("model %s: request failed", self.name)
        else:
            if self._metrics is not None and job.audio_seconds:
                self._metrics.generated(self.name, time.monotonic() - started, job.audio_seconds)
        finally:
            self.last_used = time.monotonic()


def _engine_bytes(engine) -> int:
    """Bytes of the torch modules' parameters and buffers an engine holds as attributes."""
    import torch

    seen: set[int] = set()
    total = 0
    for value in getattr(engine, "__dict__", {}).values():
        if isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    total += tensor.numel() * tensor.element_size()
    return total


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
        self.workers: list[ModelWorker] = []
        self._lock = threading.Condition()
        self._waiting: list[ModelWorker] = []  # loads waiting for room, in arrival order
        self._admitted: set[ModelWorker] = set()  # loads under way

    def add(self, worker: ModelWorker, *, loading: bool = False) -> None:
        """Manage ``worker``; ``loading``: it loads at start, and counts as loaded from now."""
        self.workers.append(worker)
        if loading:
            self._admitted.add(worker)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def pinned(self, worker: ModelWorker, change: int) -> None:
        with self._lock:
            worker.pins += change
            self._lock.notify_all()

    def turn(self, worker: ModelWorker) -> Pin | None:
        """A pin on ``worker`` if a request may take one now; None while it must wait (the
        model is loaded, and another model waits for its room)."""
        with self._lock:
            if worker.engine is not None and any(w is not worker for w in self._waiting):
                return None
            return Pin(worker)

    def _resident(self, worker: ModelWorker) -> bool:
        return worker.engine is not None or worker in self._admitted

    def _room_for(self, incoming: ModelWorker) -> bool:
        others = [w for w in self.workers if w is not incoming and self._resident(w)]
        if self.max_loaded is not None and len(others) >= self.max_loaded:
            return False
        # a model never loaded has no known size: it gets the room, and the limits are
        # applied once it has loaded (:meth:`loaded`)
        return self.memory_budget is None or not others or \
            sum(w.engine_bytes for w in others) + incoming.engine_bytes <= self.memory_budget

    def admit(self, worker: ModelWorker, job: Job) -> bool:
        """Return once ``worker`` may load its model for ``job`` (on its thread, before
        loading): idle models are unloaded to make room, else it waits its turn. False if
        ``job`` is cancelled meanwhile; an :class:`APIError` (503) if the worker stops."""
        evicted: list[ModelWorker] = []
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

    def admitted_done(self, worker: ModelWorker) -> None:
        """``worker``'s load has ended (loaded or failed)."""
        with self._lock:
            self._admitted.discard(worker)
            self._lock.notify_all()

    def _make_room(self, incoming: ModelWorker, evicted: list[ModelWorker]) -> bool:
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

    def loaded(self, worker: ModelWorker) -> None:
        """``worker`` has loaded its model: unload others, least recently used first."""
        self.rebalance(keep=worker)

    def rebalance(self, keep: ModelWorker | None = None) -> None:
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
