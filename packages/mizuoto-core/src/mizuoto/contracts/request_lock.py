"""The lock that serializes one engine's requests, and refuses the one that would corrupt.

An engine that keeps per-request state in the instance (a KV cache, a noise generator) must
run one request at a time. A synchronous call holds the lock for its duration; a stream holds
it from its first chunk to its last (or until it is closed), including while it is *paused*
between chunks, waiting for its consumer.

Two threads: the second waits. One thread: ``it = engine.stream(a); next(it);
engine.synthesize(b)`` would run ``b`` in the middle of ``a`` (the lock used to be re-entrant
for its thread, and ``a`` came back with other audio). Waiting would deadlock (only that thread
can finish ``a``), so the second request is refused with :class:`RequestConflict`. A call
nested inside a running request (a plugin's ``edit`` calling its own ``synthesize``) is not a
second request and re-enters.

It is the serial policy of an engine's scheduling object (:mod:`mizuoto.contracts.scheduling`):
``capacity`` 1.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from mizuoto.contracts.occupancy import Occupancy, Once
from mizuoto.errors import RequestConflict

T = TypeVar("T")


class RequestLock(Occupancy):
    """Releasable from another thread than the one that took it: a server may resume a
    stream's generator on any worker thread, which ``threading.RLock`` forbids."""

    #: one request at a time
    capacity = 1

    def __init__(self, engine_name: str = "engine") -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._engine_name = engine_name
        self._running: int | None = None  # the thread running the holder's code now
        self._paused_on: int | None = None  # the thread a paused stream last ran on
        self._depth = 0

    def __enter__(self) -> RequestLock:
        me = threading.get_ident()
        if self._running == me:  # a call nested inside the running request
            self._depth += 1
            return self
        if self._paused_on == me:
            raise RequestConflict(
                f"this thread holds the {self._engine_name} engine for a stream it has not "
                "finished: a second request now would change that stream's audio. Finish or "
                "close the stream first (or load another engine for the second request)")
        if not self._lock.acquire(blocking=False):
            self.count(waiting=1)
            try:
                self._lock.acquire()
            finally:
                self.count(waiting=-1)
        self._running, self._depth = me, 1
        self.count(active=1)
        return self

    def __exit__(self, *exc_info) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._running = self._paused_on = None
            self._lock.release()
            self.count(active=-1)

    def stream(self, chunks: Iterator[T], each: Callable[[T], T] = lambda chunk: chunk
               ) -> Stream[T]:
        """Iterate ``chunks`` under the lock (taken at the first chunk), marked paused while
        each chunk is with the consumer; ``each`` maps a chunk before it is handed out."""
        return Stream(self._locked(chunks, each))

    def _locked(self, chunks: Iterator[T], each: Callable[[T], T]) -> Iterator[T]:
        with self:
            while True:
                try:
                    chunk = each(next(chunks))
                except StopIteration:
                    return
                self._paused_on, self._running = self._running, None
                try:
                    yield chunk
                finally:
                    self._running, self._paused_on = threading.get_ident(), None


class NoLock(Occupancy):
    """What a plugin that declares ``concurrent_requests = True`` (plugin API 1.1) gets: no
    serialization, its requests run at once (whatever it does itself); only counted.
    ``capacity``: None (no bound), or as many as a proxy passes on (``serve --ray``)."""

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity

    def __enter__(self) -> NoLock:
        self.count(active=1)
        return self

    def __exit__(self, *exc_info) -> None:
        self.count(active=-1)

    def stream(self, chunks: Iterator[T], each: Callable[[T], T] = lambda chunk: chunk
               ) -> Stream[T]:
        return counted_stream(self, chunks, each)


def counted_stream(occupancy: Occupancy, chunks: Iterator[T], each: Callable[[T], T]
                   ) -> Stream[T]:
    """``chunks`` mapped by ``each``, counted as one active request of ``occupancy`` from now
    until its last chunk, its error, or its closing; cancelled from any thread (a scheduler's
    row at once: ``chunks.cancel``), it stops at its next chunk."""
    occupancy.count(active=1)
    ended = Once(lambda: occupancy.count(active=-1))
    row_cancel = getattr(chunks, "cancel", None)
    counted = closing_chunks(chunks, each, ended)

    def cancel() -> None:
        if row_cancel is not None:
            row_cancel()
        # a stream never started ends here (closing it runs none of its code); one making a
        # chunk in another thread ends when that chunk is done and its consumer closes it
        if inspect.getgeneratorstate(counted) == inspect.GEN_CREATED:
            ended()

    return Stream(counted, on_cancel=cancel)


def closing_chunks(chunks: Iterator[T], each: Callable[[T], T],
             ended: Callable[[], None] = lambda: None) -> Iterator[T]:
    """``chunks`` mapped by ``each``; closing this closes ``chunks`` (a row gives back its
    state); ``ended`` runs when they end, fail or are closed."""
    try:
        for chunk in chunks:
            yield each(chunk)
    finally:
        ended()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class Stream(Iterator[T]):
    """What ``engine.stream(...)`` returns: the chunks, plus :meth:`cancel` for any thread.

    Closing a generator from another thread while it runs raises "generator already
    executing"; ``cancel()`` instead marks the stream, which then stops at its next chunk (the
    chunk being made is dropped): closed at once when no chunk is being made, else by the
    consuming thread when that chunk is done. Either way the engine's lock and the request's
    state (a cache slot) are given back. ``close()`` is the consumer's own, as a generator's."""

    def __init__(self, chunks: Iterator[T], on_cancel: Callable[[], None] | None = None
                 ) -> None:
        self._chunks = chunks
        # tells the source at once, cancelled or closed (a row of the scheduler), also before
        # its first chunk, when closing the chunks' generator runs none of its code
        self._on_cancel = on_cancel
        self._guard = threading.Lock()
        self._making = False
        self._cancelled = False

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        with self._guard:
            if self._cancelled:
                raise StopIteration
            self._making = True
        try:
            chunk = next(self._chunks)
        finally:
            with self._guard:
                self._making = False
                cancelled = self._cancelled
        if cancelled:
            self.close()
            raise StopIteration
        return chunk

    def cancel(self) -> None:
        """Stop the stream at its next chunk; safe from any thread, and more than once."""
        if self._on_cancel is not None:
            self._on_cancel()
        with self._guard:
            self._cancelled = True
            if self._making:
                return  # the consuming thread closes it when its chunk is done
        self.close()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def close(self) -> None:
        if self._on_cancel is not None:
            self._on_cancel()
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
