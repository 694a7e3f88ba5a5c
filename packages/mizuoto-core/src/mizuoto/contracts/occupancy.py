"""Counting the requests running on and waiting for one engine, and waiting for it to be
idle: what every engine's scheduling object (:mod:`mizuoto.contracts.scheduling`) reports."""

from __future__ import annotations

import threading


class Occupancy:
    """Requests running and waiting on one engine, and a wait for the engine to be idle: the
    counting the scheduling objects share."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._active = 0
        self._waiting = 0

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def idle(self) -> bool:
        with self._changed:
            return not self._active and not self._waiting

    def wait_idle(self, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: not self._active and not self._waiting,
                                          timeout)

    def count(self, *, active: int = 0, waiting: int = 0) -> None:
        """Add to the running and waiting counts (negative: they left)."""
        with self._changed:
            self._active += active
            self._waiting += waiting
            self._changed.notify_all()
