"""Counting the requests running on and waiting for one engine, and waiting for it to be
idle: what every engine's scheduling object (:mod:`mizuoto.contracts.scheduling`) reports.

A server counts a request from the moment it hands it on (:meth:`Occupancy.reserve`), before
the request reaches the engine's scheduling on its own: between the two (a thread starting,
a job's checks) the engine is not idle, so that a change made only on an idle engine (a LoRA
adapter switched, the model unloaded) never slips in under a request on its way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Once:
    """``action``, run on the first call only (from any thread)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action
        self._guard = threading.Lock()

    def __call__(self) -> None:
        with self._guard:
            action, self._action = self._action, None
        if action is not None:
            action()


class Reservation:
    """A request counted on an engine's scheduling object (:meth:`Occupancy.reserve`) until
    :meth:`release` (once: later calls do nothing); also a context manager."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.release = Once(release)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class Occupancy:
    """Requests running and waiting on one engine, those a server has handed on to it
    (:meth:`reserve`), and a wait for the engine to be idle: the counting the scheduling
    objects share."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._active = 0
        self._waiting = 0
        self._reserved = 0

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def reserved(self) -> int:
        """Requests handed on (:meth:`reserve`) and not released yet, running or not."""
        return self._reserved

    @property
    def idle(self) -> bool:
        with self._changed:
            return self._is_idle()

    def wait_idle(self, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(self._is_idle, timeout)

    def _is_idle(self) -> bool:
        return not (self._active or self._waiting or self._reserved)

    def reserve(self) -> Reservation:
        """Count a request from now until the reservation is released (when it has finished,
        or was refused), whether or not it has reached the engine yet."""
        self.count(reserved=1)
        return Reservation(lambda: self.count(reserved=-1))

    def count(self, *, active: int = 0, waiting: int = 0, reserved: int = 0) -> None:
        """Add to the running, waiting and reserved counts (negative: they left)."""
        with self._changed:
            self._active += active
            self._waiting += waiting
            self._reserved += reserved
            self._changed.notify_all()
