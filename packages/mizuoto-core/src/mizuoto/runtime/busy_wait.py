"""How long a call waits for an engine's capacity (a cache slot other requests hold) before
:class:`~mizuoto.errors.EngineBusy`.

A library call waits, bounded, as a call on any busy resource does; a server answers at once
(its 429 says when to retry, and a request thread must not sit in a wait the client cannot
see). The server runs its jobs inside ``waiting_at_most(0)``; an engine with bounded capacity
asks ``busy_wait(its_default)``. A context variable, so each thread (each job) has its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_WAIT: contextvars.ContextVar[float | None] = contextvars.ContextVar("mizuoto_busy_wait",
                                                                     default=None)


def busy_wait(default: float) -> float:
    """The seconds a call in this context may wait for capacity: ``default`` unless a caller
    set a bound with :func:`waiting_at_most`."""
    value = _WAIT.get()
    return default if value is None else value


@contextlib.contextmanager
def waiting_at_most(seconds: float) -> Iterator[None]:
    """Calls made inside wait at most ``seconds`` for an engine's capacity (0: not at all)."""
    if not seconds >= 0:
        raise ValueError(f"a wait is 0 seconds or more, not {seconds!r}")
    token = _WAIT.set(float(seconds))
    try:
        yield
    finally:
        _WAIT.reset(token)
