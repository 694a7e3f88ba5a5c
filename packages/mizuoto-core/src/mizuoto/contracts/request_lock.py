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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from mizuoto.errors import RequestConflict

T = TypeVar("T")


class RequestLock:
    """Releasable from another thread than the one that took it: a server may resume a
    stream's generator on any worker thread, which ``threading.RLock`` forbids."""

    def __init__(self, engine_name: str = "engine") -> None:
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
        self._lock.acquire()
        self._running, self._depth = me, 1
        return self

    def __exit__(self, *exc_info) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._running = self._paused_on = None
            self._lock.release()

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


class NoLock:
    """What an engine that keeps all per-request state per request gets: no serialization."""

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc_info) -> None:
        return None

    def stream(self, chunks: Iterator[T], each: Callable[[T], T] = lambda chunk: chunk
               ) -> Stream[T]:
        # a scheduler's row: cancelled from any thread, it stops within one step
        return Stream(_closing(chunks, each), on_cancel=getattr(chunks, "cancel", None))


def _closing(chunks: Iterator[T], each: Callable[[T], T]) -> Iterator[T]:
    """``chunks`` mapped by ``each``; closing this closes ``chunks`` (a row gives back its
    state)."""
    try:
        for chunk in chunks:
            yield each(chunk)
    finally:
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
