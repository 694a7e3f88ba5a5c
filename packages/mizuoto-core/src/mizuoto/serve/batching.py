"""``mizuoto serve --max-batch N``: up to N requests of one model run at once, so that an engine
that batches (VoxCPM's continuous batching of streams) steps them together.

A model's worker still takes its jobs from its queue in arrival order; with ``--max-batch``
above 1 it hands each to one of N lanes (threads) instead of running it itself, and waits for
a free lane before taking the next (requests beyond that queue, and 429 beyond the queue, as
without batching). The engine does the rest: an engine with per-request state holds its lock
only per chunk, and its batcher advances every open stream in one step. An engine without a
batcher simply serializes the lanes' calls, as it serialized the worker's.

Engines opt in through their options: every installed engine whose ``options_class`` has a
``max_batch`` field gets ``engines.<name>.max_batch = N`` (and ``cache_slots`` at least N, when
it has that field), unless the options already set it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

log = logging.getLogger("mizuoto.serve")

#: the most requests one model may run at once
MAX_BATCH = 256


def options_with_max_batch(options, max_batch: int):
    """``options`` (a :class:`mizuoto.Options` or None) with ``engines.<name>.max_batch`` set
    for each installed engine that batches."""
    from mizuoto.options import Options
    from mizuoto.registry import engines

    options = options or Options()
    sections = {name: dict(section) for name, section in options.engines.items()}
    for name, engine in engines().items():
        fields = attrs.fields_dict(engine.options_class) \
            if attrs.has(engine.options_class or object) else {}
        if "max_batch" not in fields:
            continue
        section = sections.setdefault(name, {})
        section.setdefault("max_batch", max_batch)
        if "cache_slots" in fields:
            default = fields["cache_slots"].default
            section.setdefault("cache_slots", max(int(default), section["max_batch"]))
    return attrs.evolve(options, engines=sections)


class Lanes:
    """At most ``size`` jobs of one model at once, each on its own thread."""

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
