"""One scheduling object per loaded engine, owned by the core: how that engine's requests share
it. The engine declares which kind it needs and writes no lock:

- an engine that declares the step interface
  (:class:`~mizuoto.contracts.features.SupportsSteps`): the core's
  :class:`~mizuoto.contracts.scheduler.Scheduler`, which steps the open requests together as
  rows (``capacity``: its ``max_rows``);
- an engine whose requests alternate piece by piece (``Engine.takes_turns_per = "chunk"``,
  F5-TTS): :class:`~mizuoto.contracts.turns.ChunkTurns`, a turn around each chunk of the
  engine's ``_stream`` (``capacity``: unbounded, the requests take turns);
- an engine that keeps a request's state in the instance (the default,
  ``takes_turns_per = "request"``): :class:`~mizuoto.contracts.request_lock.RequestLock`, one
  request from its first chunk to its last (``capacity`` 1);
- a plugin written for API 1.1 or earlier that declares ``concurrent_requests = True`` runs
  its requests at once, doing whatever it does itself:
  :class:`~mizuoto.contracts.request_lock.NoLock` (``capacity``: unbounded).

Every one of them answers what a server needs to know (:class:`RequestScheduling`): how many
requests it runs at once, how many are running and waiting, and whether the engine is idle
(counted by :class:`~mizuoto.contracts.occupancy.Occupancy`), counting a request from the
moment the server hands it on (:meth:`RequestScheduling.reserve`), before it reaches the
engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

from mizuoto.contracts.api import deprecated
from mizuoto.contracts.features import stepping_engine
from mizuoto.contracts.occupancy import Reservation
from mizuoto.contracts.request_lock import NoLock, RequestLock
from mizuoto.contracts.scheduler import scheduler_for
from mizuoto.contracts.turns import ChunkTurns

T = TypeVar("T")

#: ``Engine.takes_turns_per``'s values: a whole request, or a chunk of one.
TURNS = ("request", "chunk")


@runtime_checkable
class RequestScheduling(Protocol):
    """What every engine's scheduling object offers (:func:`scheduling_for`)."""

    @property
    def capacity(self) -> int | None:
        """The most requests the engine runs at once (None: no bound, they take turns)."""

    @property
    def active(self) -> int:
        """Requests running now (a stream from its first chunk to its last)."""

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn (or for a row) now."""

    @property
    def reserved(self) -> int:
        """Requests a server has handed on (:meth:`reserve`) and not released yet."""

    @property
    def idle(self) -> bool:
        """No request is running, waiting, or reserved."""

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until the engine is idle (at most ``timeout`` seconds); whether it is."""

    def reserve(self) -> Reservation:
        """Count a request from now, before it reaches the engine (a server hands it to a
        thread), until the :class:`~mizuoto.contracts.occupancy.Reservation` is released:
        meanwhile the engine is not idle."""

    def __enter__(self) -> Any:
        """A synchronous piece of work of one request (an edit, a voice, a stream's checks)."""

    def __exit__(self, *exc_info) -> None: ...

    def stream(self, chunks: Iterator[T], each: Callable[[T], T] = ...) -> Iterator[T]:
        """``chunks`` handed out as the policy allows, each mapped by ``each``; the result has
        ``cancel()`` (any thread): the stream stops at its next chunk."""


def check_scheduling_declared(cls: type) -> None:
    """For an engine class being defined: a :class:`TypeError` naming the choices where its
    ``takes_turns_per`` is not one of :data:`TURNS`, and a
    :class:`~mizuoto.contracts.api.PluginAPIDeprecation` where it declares
    ``concurrent_requests = True`` (it still works) rather than how its requests take turns."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls.takes_turns_per not in TURNS:
        raise TypeError(f"{name}.takes_turns_per is {cls.takes_turns_per!r}: declare one of "
                        f"{', '.join(TURNS)}")
    if cls.__dict__.get("concurrent_requests") and stepping_engine(cls) is None:
        deprecated(f"{name} declares concurrent_requests = True: it still works (its requests "
                   "run at once, guarded by the engine itself), but an engine writes no lock "
                   "now: declare takes_turns_per = 'chunk' (the base class takes a turn per "
                   "chunk of _stream) or the step interface, SupportsSteps (see "
                   "docs/changelog.md)", stacklevel=4)


def scheduling_for(engine) -> RequestScheduling:
    """``engine``'s one scheduling object (made on first use), from what its class declares."""
    scheduling = engine.__dict__.get("_mizuoto_scheduling")
    if scheduling is None:
        with _MAKING:
            scheduling = engine.__dict__.get("_mizuoto_scheduling")
            if scheduling is None:
                scheduling = engine.__dict__["_mizuoto_scheduling"] = _made_for(engine)
    return scheduling


def _made_for(engine) -> RequestScheduling:
    if stepping_engine(engine) is not None:
        return scheduler_for(engine)
    if getattr(engine, "takes_turns_per", "request") == "chunk":
        return ChunkTurns()
    if getattr(engine, "concurrent_requests", False):
        return NoLock()
    return RequestLock(engine.name)


_MAKING = threading.Lock()
