"""``mizuoto serve --max-batch N``: up to N requests of one model run at once, so that an engine
that batches (VoxCPM's continuous batching of streams) steps them together.

A model's worker still takes its jobs from its queue in arrival order; where the loaded
engine's scheduling object runs more than one request at once (its ``capacity``: the rows of
a stepping engine, which ``--max-batch`` sets; no bound for one whose requests take turns per
chunk), it hands each to one of that many lanes (:class:`Lanes`, a thin thread pool sized by
the scheduling) instead of running it itself, and waits for a free lane before taking the
next (requests beyond that queue, and 429 beyond the queue, as without lanes). The engine's
scheduling does the rest: the core's scheduler steps every open row together, turns hand the
engine to each request's next chunk in arrival order.

Engines opt in by declaring :class:`~mizuoto.contracts.features.SupportsBatching`: every
installed engine that does gets the options its ``batch_options(section, N)`` returns (VoxCPM:
``engines.voxcpm.max_batch = N`` and at least N cache slots), unless the options already set
them; ``/metrics`` shows the loaded engine's ``batch_stats``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

from mizuoto.contracts.features import batching_engine

log = logging.getLogger("mizuoto.serve")

#: the most requests one model may run at once
MAX_BATCH = 256


def options_with_max_batch(options, max_batch: int):
    """``options`` (a :class:`mizuoto.Options` or None) with the options each installed engine
    that batches asks for to batch up to ``max_batch`` requests (what ``options`` sets wins);
    ``options`` itself for ``max_batch`` 1."""
    from mizuoto.options import Options
    from mizuoto.registry import engines

    if max_batch <= 1:
        return options
    options = options or Options()
    sections = {name: dict(section) for name, section in options.engines.items()}
    for name, engine in engines().items():
        if batching_engine(engine) is not None:
            sections[name] = engine.batch_options(sections.get(name, {}), max_batch)
    return attrs.evolve(options, engines=sections)


def batch_stats(engine):
    """The loaded ``engine``'s batching statistics, if it batches (None for no engine)."""
    batching = batching_engine(engine) if engine is not None else None
    return batching.batch_stats if batching is not None else None


class Lanes:
    """At most ``size`` jobs of one model at once, each on its own thread: ``size`` is the
    engine's scheduling ``capacity``; what runs together and in which order is the
    scheduling's, not the lanes'."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._free = threading.Semaphore(size)
        self._guard = threading.Lock()
        self._idle = threading.Condition(self._guard)
        self._active = 0

    @property
    def active(self) -> int:
        return self._active

    def run(self, job: Callable[[], None]) -> None:
        """Start ``job`` on a lane once one is free (blocks until then)."""
        self._free.acquire()
        with self._guard:
            self._active += 1
        thread = threading.Thread(target=self._lane, args=(job,), daemon=True,
                                  name=f"mizuoto-model-{self.name}-lane")
        thread.start()

    def _lane(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException:  # a job reports its own errors; this only keeps the lane alive
            log.exception("model %s: a lane's job failed", self.name)
        finally:
            with self._guard:
                self._active -= 1
                self._idle.notify_all()
            self._free.release()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no job runs (at most ``timeout`` seconds); True if none does."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)
