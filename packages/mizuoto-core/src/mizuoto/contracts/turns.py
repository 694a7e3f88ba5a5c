"""Turns: how the requests of one model that run one piece at a time take turns, for an engine
that does not declare the step interface (whose requests the scheduler,
:mod:`mizuoto.contracts.scheduler`, steps together). A re-entrant lock, handed to waiting
threads in arrival order.

F5-TTS takes a turn per text chunk, so that two long requests alternate chunks. A plain
``threading.RLock`` promises no order: the thread that releases it after a chunk may take it
straight back for its next chunk before the waiting thread wakes (on the tiny test model two
threads of six chunks each ran ``BABABABAABAB``). Here a release hands the lock to the longest
waiter, and the thread that released it queues behind.
"""

from __future__ import annotations

import threading
from collections import deque


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
