"""What a request hands a model's worker: a :class:`Job` (work run on the worker's thread,
read back on the event loop) and a :class:`Pin` (the request's hold on its model)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

#: Emitted last by every job.
DONE = object()
#: A job's ``adapter`` when it runs with whichever adapter is applied (it reads no weights).
ANY_ADAPTER = object()
#: Items (audio chunks) a job may have waiting for its client: a client that reads slowly
#: slows its own generation instead of piling its audio up in the server's memory.
MAX_BUFFERED = 8


class Cancelled(Exception):
    """The client went away: the job stops where it is."""


class Pin:
    """A request's hold on its model: while any pin is held the pool does not unload the model.
    Taken when the request arrives, so that the model it waits for stays loaded until its job
    has run; handed to that job (``Job(pin=...)``), which releases it when it ends."""

    def __init__(self, worker) -> None:
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
    :class:`Pin`) is released when the job ends, run or skipped. ``adapter``: the LoRA adapter
    it runs with, by name (None: the base model; :data:`ANY_ADAPTER`: whichever is applied),
    for all of its chunks (:mod:`mizuoto.serve.adapters`)."""

    def __init__(self, run: Callable, loop: asyncio.AbstractEventLoop, *,
                 pin: Pin | None = None, adapter: str | None | object = ANY_ADAPTER) -> None:
        self._run = run
        self.adapter = adapter
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
