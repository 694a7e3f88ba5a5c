"""One worker thread per loaded model, fed by a bounded queue: the only place model code runs.

The event loop submits a :class:`~mizuoto.serve.jobs.Job` and reads what it emits (audio
chunks, a voice, an error, then :data:`~mizuoto.serve.jobs.DONE`) from an ``asyncio.Queue``.
Requests for different models run in parallel on their workers. A model's worker takes its
jobs in arrival order and runs as many at once as the loaded engine's scheduling object says
it runs (its ``capacity``: :mod:`mizuoto.contracts.scheduling`): one after the other for an
engine that runs one request at a time (a stream holding the engine from its first chunk to
its last), and on lanes (:class:`~mizuoto.serve.batching.Lanes`) for one whose requests take
turns per chunk or step together as rows; the engine's scheduling does the rest, and counts
each job from the moment the worker hands it on (``scheduling.reserve()``), so that it alone
says whether the engine is idle (an adapter switch, an unload). A job whose client went away
is skipped if still queued, and stopped at the engine's next progress report or chunk if
running. Which models stay loaded, and when a request may pin one, is the
:class:`~mizuoto.serve.pool.ModelPool`'s.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from mizuoto.contracts.occupancy import Reservation
from mizuoto.runtime.busy_wait import waiting_at_most
from mizuoto.serve.adapters import holds_adapters
from mizuoto.serve.batching import Lanes
from mizuoto.serve.errors import APIError, from_mizuoto, unavailable, without_paths
from mizuoto.serve.jobs import ANY_ADAPTER, DONE, MAX_BUFFERED, Cancelled, Job, Pin
from mizuoto.serve.pool import ModelPool

__all__ = ["DONE", "MAX_BUFFERED", "Cancelled", "Job", "ModelPool", "ModelWorker", "Pin"]

log = logging.getLogger("mizuoto.serve")


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
                 pool: ModelPool | None = None, preload: bool = True) -> None:
        self.name = name
        # jobs run on lanes, several at once, when the loaded engine's scheduling runs several
        # (rows stepped together, up to --max-batch; requests taking turns per chunk)
        self._lanes: Lanes | None = None
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
            if self.engine is None or self._running is not None or not self._queue.empty() \
                    or self.pins or not _engine_idle(self.engine):
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
            self._fit_lanes(engine)
        except BaseException as exc:  # reported to every request for this model
            self.engine, self.error, self.state = None, exc, "failed"
            log.error("model %s failed to load: %s", self.name, exc)
            raise
        self.loads += 1
        self.last_used = time.monotonic()
        if self.state == "loading":
            self.state = "ready"
        log.info("model %s ready (%s)", self.name, self.model)

    def _fit_lanes(self, engine) -> None:
        """Lanes for as many jobs at once as ``engine``'s scheduling runs (none for 1; as many
        as may queue where it sets no bound: the requests take turns). Kept over an unload
        and reload: the same model schedules the same."""
        scheduling = getattr(engine, "scheduling", None)
        size = 1 if scheduling is None else scheduling.capacity or self.queue_size
        if size > 1 and self._lanes is None:
            self._lanes = Lanes(self.name, size)

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
            reservation = None
            on_lane = False  # a lane's job finishes on its lane
            try:
                with self._engine_lock:
                    if self.engine is None and not job.cancelled and not self._reload(job):
                        continue
                    if not self._select_adapter(job):
                        continue
                    # counted by the engine's scheduling from here, not only once the job
                    # reaches it on its lane: an adapter switch waits for it
                    reservation = _reserve(self.engine)
                    if self._lanes is None:
                        self._execute(job)
                if self._lanes is not None:
                    self._lanes.run(lambda job=job, held=reservation:
                                    self._execute_on_lane(job, held))
                    on_lane = True
            finally:
                self._running = None
                if not on_lane:
                    if reservation is not None:
                        reservation.release()
                    job.finish()
            if self._pool is not None:  # a model busy when another loaded may go now
                self._pool.rebalance()

    def _select_adapter(self, job: Job) -> bool:
        """Apply ``job``'s adapter (``mizuoto serve --lora-dir``) unless it is applied: once
        the engine is idle (the jobs handed on before, on lanes or not yet in the engine, are
        counted by its scheduling: :func:`_reserve`), so that requests of two adapters never
        run together. False, with the error sent to ``job``, when it cannot be applied."""
        wanted = job.adapter
        if wanted is ANY_ADAPTER or not holds_adapters(self.engine) \
                or self.engine.active_adapter == wanted:
            return True
        scheduling = getattr(self.engine, "scheduling", None)
        if scheduling is not None:
            scheduling.wait_idle(None)
        try:
            self.engine.set_adapter(wanted)
        except BaseException as exc:
            job.emit(exc)
            return False
        return True

    def _execute_on_lane(self, job: Job, reservation: Reservation) -> None:
        """``--max-batch``: one of the jobs running at once (mizuoto.serve.batching)."""
        try:
            self._execute(job)
        finally:
            reservation.release()
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


def _engine_idle(engine) -> bool:
    """No request runs on, waits for, or is on its way to ``engine`` (its scheduling object
    says; an object that has none counts as idle: the worker's own count of jobs is all
    there is)."""
    scheduling = getattr(engine, "scheduling", None)
    return scheduling is None or scheduling.idle


def _reserve(engine) -> Reservation:
    """A job handed on to ``engine``, counted by its scheduling object until released
    (nothing to count for an object that has none: it runs no lanes)."""
    scheduling = getattr(engine, "scheduling", None)
    return scheduling.reserve() if scheduling is not None else Reservation(lambda: None)


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
