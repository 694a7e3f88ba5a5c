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
import logging
import queue
import threading
import time
from collections.abc import Callable

from mizuoto.serve.errors import APIError, from_mizuoto, unavailable

log = logging.getLogger("mizuoto.serve")

#: Emitted last by every job.
DONE = object()


class Cancelled(Exception):
    """The client went away: the job stops where it is."""


class Job:
    """Work for a model's worker: ``run(engine, job)`` executes on the worker thread and calls
    :meth:`emit` for each result; the event loop awaits :attr:`items`."""

    def __init__(self, run: Callable, loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop
        self.items: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.audio_seconds = 0.0

    def emit(self, item) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)

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


class ModelWorker:
    """Loads one model on its own thread, then runs that model's jobs one at a time.

    ``state``: ``loading``, ``ready``, ``failed`` (``error`` says why) or ``stopped``.
    ``shared_lock`` (benchmarks only) makes every worker take one lock around each job: the
    single-global-lock server this design is measured against.
    """

    def __init__(self, name: str, model: str, *, load: Callable[[], object], queue_size: int,
                 metrics=None, shared_lock: threading.Lock | None = None) -> None:
        self.name = name
        self.model = model
        self._load = load
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._metrics = metrics
        self._shared_lock = shared_lock
        self._running: Job | None = None
        self.engine = None
        self.state = "loading"
        self.error: BaseException | None = None
        self.loaded = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"mizuoto-model-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def depth(self) -> int:
        """Jobs queued or running."""
        return self._queue.qsize() + (self._running is not None)

    def submit_check(self) -> None:
        """An :class:`APIError` (503) unless the model is loaded and taking requests."""
        if self.state == "loading":
            raise unavailable(f"model {self.name!r} is still loading", "model_loading")
        if self.state == "failed":
            raise unavailable(f"model {self.name!r} failed to load: {self.error}",
                              "model_unavailable", 60)
        if self.state != "ready":
            raise unavailable("the server is shutting down", "shutting_down")

    def submit(self, job: Job) -> None:
        """Queue ``job``; an :class:`APIError` when the model cannot take it now."""
        self.submit_check()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise APIError(429, f"model {self.name!r} has {self._queue.maxsize} requests "
                           "waiting: try again shortly", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"}) from None

    def stop(self, timeout: float) -> None:
        """Take no more jobs, cancel queued ones, let the running one finish within
        ``timeout`` seconds."""
        if self.state in ("loading", "ready"):
            self.state = "stopped"
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(unavailable("the server is shutting down", "shutting_down"))
                job.emit(DONE)
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self.engine = self._load()
        except BaseException as exc:  # reported to every request for this model
            self.error = exc
            self.state = "failed"
            log.error("model %s failed to load: %s", self.name, exc)
            self.loaded.set()
            return
        if self.state == "loading":
            self.state = "ready"
        log.info("model %s ready (%s)", self.name, self.model)
        self.loaded.set()
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._running = job
            try:
                self._execute(job)
            finally:
                self._running = None

    def _execute(self, job: Job) -> None:
        started = time.monotonic()
        try:
            if job.cancelled:
                raise Cancelled
            with self._shared_lock or contextlib.nullcontext():
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
            job.emit(DONE)
