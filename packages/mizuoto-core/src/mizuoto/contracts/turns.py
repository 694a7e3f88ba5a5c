"""Turns: how the requests of one model that run one piece at a time take turns, for an engine
that does not declare the step interface (whose requests the scheduler,
:mod:`mizuoto.contracts.scheduler`, steps together). :class:`Turns` is a re-entrant lock,
handed to waiting threads in arrival order; :class:`ChunkTurns` is the scheduling object of an
engine that declares ``takes_turns_per = "chunk"`` (:mod:`mizuoto.contracts.scheduling`): the
base class takes a turn around each chunk of the engine's ``_stream``, and the engine writes
no lock.

F5-TTS takes a turn per text chunk, so that two long requests alternate chunks. A plain
``threading.RLock`` promises no order: the thread that releases it after a chunk may take it
straight back for its next chunk before the waiting thread wakes (on the tiny test model two
threads of six chunks each ran ``BABABABAABAB``). Here a release hands the lock to the longest
waiter, and the thread that released it queues behind.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TypeVar

from mizuoto.contracts.occupancy import Occupancy
from mizuoto.contracts.request_lock import Stream, counted_stream

T = TypeVar("T")


class Turns:
    """A re-entrant lock granted first come, first served: ``with turns:`` around each piece of
    a request's work (a chunk), and concurrent requests alternate pieces."""

    def __init__(self) -> None:
        self._state = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._queue: deque[int] = deque()  # waiting threads' idents, in arrival order

    def __enter__(self) -> Turns:
        me = threading.get_ident()
        with self._state:
            if self._owner == me:  # the engine called again from a progress callback
                self._depth += 1
                return self
            self._queue.append(me)
            try:
                while self._owner is not None or self._queue[0] != me:
                    self._state.wait()
            except BaseException:  # interrupted while waiting: give up the place in line
                self._queue.remove(me)
                self._state.notify_all()
                raise
            self._queue.popleft()
            self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._state:
            if self._owner != threading.get_ident():
                raise RuntimeError("a turn is given back by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._state.notify_all()

    @property
    def waiting(self) -> int:
        """How many threads wait for their turn now."""
        with self._state:
            return len(self._queue)


class ChunkTurns(Occupancy):
    """The requests of one engine take turns chunk by chunk: each chunk of a request's stream
    (one ``next()`` of the engine's ``_stream``) and each synchronous piece of work (``with
    turns:``: an edit, a voice, a stream's checks) is one turn of a :class:`Turns`, so two long
    requests alternate chunks and a short one waits one chunk, not a whole text. Re-entrant:
    a progress callback may call the engine again. ``capacity``: None (no bound: every request
    runs, in turns); ``active``: requests from their call to their last chunk (or closing);
    ``waiting``: requests waiting for a turn now."""

    capacity = None

    def __init__(self) -> None:
        super().__init__()
        self._turns = Turns()

    @property
    def waiting(self) -> int:
        return self._turns.waiting

    def __enter__(self) -> ChunkTurns:
        self.count(active=1)
        try:
            self._turns.__enter__()
        except BaseException:
            self.count(active=-1)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self._turns.__exit__(*exc_info)
        finally:
            self.count(active=-1)

    def stream(self, chunks: Iterator[T], each: Callable[[T], T] = lambda chunk: chunk
               ) -> Stream[T]:
        """``chunks``, each made in a turn of its own; cancelled or closed, it stops at its
        next chunk."""
        return counted_stream(self, _each_in_a_turn(self._turns, chunks), each)


def _each_in_a_turn(turns: Turns, chunks: Iterator[T]) -> Iterator[T]:
    """``chunks``, each ``next()`` holding a turn; handed out (and closed) outside it."""
    try:
        while True:
            with turns:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
