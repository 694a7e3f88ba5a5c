"""The core scheduler: everything between "a request was accepted" and "its last chunk was
sent", for an engine that declares the step interface
(:class:`~mizuoto.contracts.features.SupportsSteps`).

The engine writes the step (open a request's row, advance a set of rows one step together,
close a row); it writes no locks and no threads. The scheduler owns:

- admission: at most ``max_rows`` rows step together; up to ``queue_size`` more wait, opened,
  for a free row (they join at the next step: continuous batching); past that a request is
  refused at once with :class:`~mizuoto.errors.EngineBusy` (a server's 429), as is a request
  whose thread itself consumes every open row (it would wait for itself);
- arrivals: a step that admits rows first waits, at most ``admission_wait`` seconds (0 unless
  the engine batches: its ``admission_wait``), until no request has arrived for a fiftieth of
  a second, so that listeners connecting together are admitted at one step (their first
  audio from one batched step, and batches whose make-up does not depend on thread timing);
- turns: every open row is stepped together, so no request waits for another to end; the
  step runs in the thread of a consumer that wants its next chunk (no thread of its own);
- back-pressure: a row whose consumer has :data:`MAX_WAITING` chunks unread sits the steps
  out until it reads one, instead of piling audio up in memory;
- cancellation: a row cancelled (its client left: :meth:`Row.cancel`, or its iterator closed),
  whose progress callback raises, or whose deadline passed, is closed before the next step:
  its work stops within one step, and its state is released.

It is such an engine's scheduling object (:mod:`mizuoto.contracts.scheduling`): ``capacity``
is ``max_rows``, ``active`` the rows stepping, ``waiting`` those waiting for a place.

Each row keeps the generator the base class made for its request (from the request's seed),
so a request's audio never depends on its batch mates where the engine's arithmetic is
row-independent (the contract suite checks it in float32).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import attrs

from mizuoto.contracts.occupancy import Reservation
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.request_lock import Stream, closing_chunks
from mizuoto.contracts.results import Rendered
from mizuoto.errors import DeadlineExceeded, EngineBusy

log = logging.getLogger("mizuoto.scheduler")

#: Rows stepped together unless the engine's ``max_rows`` says otherwise.
DEFAULT_MAX_ROWS = 8
#: Requests waiting for a row beyond ``max_rows``, unless set otherwise.
DEFAULT_QUEUE_SIZE = 64
#: Chunks a row may have unread before it sits the steps out (back-pressure).
MAX_WAITING = 8
#: A step that admits rows waits until no request has arrived for this long (seconds), at
#: most the scheduler's ``admission_wait``.
ARRIVAL_QUIET = 0.02


@attrs.frozen
class StepStats:
    """What a scheduler has done: ``steps`` taken, ``rows`` stepped (over all steps),
    ``seconds`` spent in the engine's steps, the last step's size (``last_size``)."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    last_size: int = 0


class Row(Iterator[Rendered]):
    """One request in the scheduler: iterate it for its chunks (the last has ``last=True``)
    in one thread; :meth:`cancel` from any thread stops it within one step."""

    def __init__(self, scheduler: Scheduler, state: Any, progress: ProgressCallback | None,
                 deadline: float | None) -> None:
        self._scheduler = scheduler
        self.state = state
        self.progress = progress
        self.deadline = deadline
        self.steps = 0
        self._chunks: deque[Rendered] = deque()
        self._error: BaseException | None = None
        self._consumer = threading.get_ident()  # the thread that reads it (last seen)
        self.queued_at = time.monotonic()
        self._ended = False  # closed by the scheduler (done, cancelled or failed)
        self._cancelled = False

    def __iter__(self) -> Row:
        return self

    def __next__(self) -> Rendered:
        return self._scheduler._next(self)

    def cancel(self) -> None:
        """Stop the row (from any thread): released now, or after the step being taken."""
        self._scheduler._cancel(self)

    close = cancel

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def ended(self) -> bool:
        """The scheduler has closed the row (its last chunk made, cancelled or failed)."""
        return self._ended


class Scheduler:
    """Steps the open rows of one loaded ``engine`` (a
    :class:`~mizuoto.contracts.features.SupportsSteps`) together. No thread of its own: a
    consumer that wants a chunk its row does not have yet takes the next step, for every open
    row, while the others wait for it (so a lone request runs in its caller's thread exactly
    as a stream of its own would)."""

    def __init__(self, engine, *, max_rows: int = DEFAULT_MAX_ROWS,
                 queue_size: int = DEFAULT_QUEUE_SIZE, admission_wait: float = 0.0) -> None:
        self._engine = engine
        self.max_rows = max_rows
        self.queue_size = queue_size
        self.admission_wait = admission_wait
        self._arriving = 0  # requests between submit and their row queued (open_row runs)
        self._last_arrival = 0.0
        self._changed = threading.Condition(threading.Lock())
        self._active: list[Row] = []
        self._waiting: deque[Row] = deque()
        self._stepping = False
        self._held = 0  # hold_rows(): no row may open
        self._reserved = 0  # requests a server handed on (reserve()), not released yet
        self.stats = StepStats()

    @property
    def open_rows(self) -> int:
        """Rows not yet closed: stepping, and waiting for a place."""
        with self._changed:
            return len(self._active) + len(self._waiting)

    # -- what every engine's scheduling object answers (mizuoto.contracts.scheduling) ---------

    @property
    def capacity(self) -> int:
        """The most requests stepped together: ``max_rows``."""
        return self.max_rows

    @property
    def active(self) -> int:
        """Rows stepping now."""
        with self._changed:
            return len(self._active)

    @property
    def waiting(self) -> int:
        """Rows waiting for a place."""
        with self._changed:
            return len(self._waiting)

    @property
    def reserved(self) -> int:
        """Requests handed on (:meth:`reserve`) and not released yet, running or not."""
        with self._changed:
            return self._reserved

    @property
    def idle(self) -> bool:
        """No row open and none on its way (reserved, or arriving)."""
        with self._changed:
            return self._is_idle()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no row is open (at most ``timeout`` seconds); whether none is."""
        with self._changed:
            return self._changed.wait_for(self._is_idle, timeout)

    def _is_idle(self) -> bool:
        return not (self._active or self._waiting or self._arriving or self._reserved)

    def reserve(self) -> Reservation:
        """Count a request from now until the reservation is released (when it has finished,
        or was refused), whether or not its row has opened yet."""
        self._reserved_by(1)
        return Reservation(lambda: self._reserved_by(-1))

    def _reserved_by(self, change: int) -> None:
        with self._changed:
            self._reserved += change
            self._changed.notify_all()

    def __enter__(self) -> Scheduler:
        return self  # an edit or a voice of a stepping engine runs beside the rows

    def __exit__(self, *exc_info) -> None:
        return None

    def stream(self, chunks: Iterator, each=lambda chunk: chunk) -> Stream:
        """A row's chunks (``chunks``) mapped by ``each``: cancelled from any thread, the row
        stops within one step."""
        return Stream(closing_chunks(chunks, each), on_cancel=getattr(chunks, "cancel", None))

    def submit(self, request, params, generator, *, progress: ProgressCallback | None = None,
               deadline: float | None = None) -> Row:
        """Open a row for a planned request (the engine's ``open_row``, in this thread: a
        request it refuses raises here) and queue it; ``deadline`` (``time.monotonic()``) ends
        it with :class:`~mizuoto.errors.DeadlineExceeded` once passed."""
        self._check_room()
        with self._arrival():
            state = self._engine.open_row(request, params, generator)
        return self.enqueue(state, progress=progress, deadline=deadline)

    @contextlib.contextmanager
    def _arrival(self) -> Iterator[None]:
        """A request on its way to its row (the engine's ``open_row``): a step that admits
        rows waits for it too (at most ``admission_wait``)."""
        with self._changed:
            self._arriving += 1
            self._last_arrival = time.monotonic()
        try:
            yield
        finally:
            with self._changed:
                self._arriving -= 1
                self._changed.notify_all()

    def enqueue(self, state: Any, *, progress: ProgressCallback | None = None,
                deadline: float | None = None) -> Row:
        """Queue a row the engine opened itself (``state``, as ``open_row`` returns one): for
        an engine with more than one kind of row (VoxCPM's whole utterances beside its
        streams). The scheduler closes it (``close_row``) as any other."""
        try:
            self._check_room()
        except BaseException:
            self._engine.close_row(state)
            raise
        row = Row(self, state, progress, deadline)
        with self._changed:
            self._waiting.append(row)
            self._last_arrival = time.monotonic()
            self._changed.notify_all()
        return row

    def _check_room(self) -> None:
        with self._changed:
            if self._held:
                raise EngineBusy(f"the {self._engine.name} model is changing (its weights or "
                                 "settings) and takes no request now", "retry in a moment")
            if len(self._active) + len(self._waiting) >= self.max_rows + self.queue_size:
                raise EngineBusy(f"{self.max_rows} requests are being spoken and "
                                 f"{self.queue_size} wait", "retry when one has finished")

    @contextlib.contextmanager
    def hold_rows(self) -> Iterator[None]:
        """No row open while the block runs (a change of the engine's weights: a LoRA), and
        none opens: :class:`~mizuoto.errors.EngineBusy` when one is open now."""
        with self._changed:
            if self._active or self._waiting:
                count = len(self._active) + len(self._waiting)
                raise EngineBusy(f"{count} request(s) are open on this {self._engine.name} "
                                 "model; it cannot change under them",
                                 "finish or close the open streams first")
            self._held += 1
        try:
            yield
        finally:
            with self._changed:
                self._held -= 1

    def _next(self, row: Row) -> Rendered:
        while True:
            with self._changed:
                row._consumer = threading.get_ident()
                rows = None
                while rows is None:
                    if row._chunks:
                        return row._chunks.popleft()
                    if row._ended:
                        error, row._error = row._error, None
                        if error is not None:
                            raise error
                        raise StopIteration
                    if not self._stepping:
                        if self._await_arrivals():
                            continue  # the lock was let go: look again
                        rows = self._rows_to_step() or None
                        if self._waits_for_itself(row):
                            rows = None
                            continue  # ended there
                        if rows is None and row._ended:  # closed there (its deadline)
                            continue
                    if rows is None:  # another consumer is stepping (this row too), or the
                        self._changed.wait()  # row waits for a place: a row must close first
                self._stepping = True
            try:
                self._step(rows)
            finally:
                with self._changed:
                    self._stepping = False
                    self._changed.notify_all()

    def _cancel(self, row: Row) -> None:
        with self._changed:
            if row._ended:  # its last chunk made (or closed) already
                return
            row._cancelled = True
            if not self._stepping or row not in self._active:
                self._end(row, None)  # else closed once the step being taken ends
            self._changed.notify_all()

    def _await_arrivals(self) -> bool:
        """Under the lock, before a step that would admit rows: wait until none is on its way
        and none came for ``ARRIVAL_QUIET``, at most ``admission_wait`` after the first
        waiting row was queued; whether it waited."""
        if not self.admission_wait or not self._waiting or len(self._active) >= self.max_rows:
            return False
        now = time.monotonic()
        latest = self._waiting[0].queued_at + self.admission_wait  # the first to wait, bounded
        until = latest if self._arriving else min(self._last_arrival + ARRIVAL_QUIET, latest)
        if now >= until:
            return False
        self._changed.wait(until - now)
        return True

    def _waits_for_itself(self, row: Row) -> bool:
        """Under the lock: end ``row`` with :class:`~mizuoto.errors.EngineBusy` when it waits
        for a place that only its own thread could free (every open row is read by it: a
        stream it has not finished), instead of waiting forever."""
        me = row._consumer
        if row not in self._waiting or any(r._consumer != me for r in self._active):
            return False
        setting = getattr(self._engine, "rows_setting", None)
        larger = f", or load the model with a larger {setting}" if setting else ""
        self._end(row, EngineBusy(
            f"all {self.max_rows} rows of this {self._engine.name} model are held by open "
            "requests of this thread (streams not yet finished or closed)",
            f"finish or close a stream first{larger}"))
        return True

    def _rows_to_step(self) -> list[Row]:
        """Under the lock: close what must end, admit waiting rows (continuous batching: they
        join at this step), and the rows to step now: those whose consumer is not
        :data:`MAX_WAITING` chunks behind (back-pressure)."""
        now = time.monotonic()
        for row in [*self._active, *self._waiting]:
            if row._cancelled:
                self._end(row, None)
            elif row.deadline is not None and now >= row.deadline:
                self._end(row, DeadlineExceeded(f"the request ran past its deadline after "
                                                f"{row.steps} steps", "allow it longer"))
        while self._waiting and len(self._active) < self.max_rows:
            self._active.append(self._waiting.popleft())
        return [row for row in self._active if len(row._chunks) < MAX_WAITING]

    def _step(self, rows: list[Row]) -> None:
        started = time.perf_counter()
        try:
            made = self._engine.step_rows([row.state for row in rows])
            if len(made) != len(rows):
                raise RuntimeError(f"{self._engine.name}.step_rows returned {len(made)} "
                                   f"results for {len(rows)} rows")
        except BaseException as exc:  # every row of the step ends with the engine's error
            log.debug("a step of %s failed: %r", self._engine.name, exc)
            with self._changed:
                for row in rows:
                    self._end(row, exc)
            return
        stats = self.stats
        self.stats = StepStats(stats.steps + 1, stats.rows + len(rows),
                               stats.seconds + time.perf_counter() - started, len(rows))
        for row, chunks in zip(rows, made, strict=True):
            row.steps += 1
            failed = None
            if isinstance(chunks, BaseException):  # the row's own failure: it ends alone
                failed, chunks = chunks, ()
            try:
                if failed is None:  # raises to stop (a client gone); the engine names its stage
                    stage = getattr(self._engine, "row_progress", _no_stage)(row.state)
                    report(row.progress, *(stage or ("step", row.steps)))
            except BaseException as exc:
                failed = exc
            with self._changed:
                row._chunks.extend(chunks)
                if failed is not None or row._cancelled or any(c.last for c in chunks):
                    self._end(row, failed)

    def _end(self, row: Row, error: BaseException | None) -> None:
        """Under the lock: close ``row`` (once), releasing its state."""
        if row._ended:
            return
        if row in self._active:
            self._active.remove(row)
        elif row in self._waiting:
            self._waiting.remove(row)
        row._ended = True
        row._error = error
        if row._cancelled:
            row._chunks.clear()  # nobody reads them
        try:
            self._engine.close_row(row.state)
        except Exception:  # the row ends anyway; its consumer gets its own error, if any
            log.exception("%s.close_row failed", self._engine.name)
        finally:
            row.state = None
        self._changed.notify_all()


def _no_stage(state: Any) -> None:
    return None


def scheduler_for(engine) -> Scheduler:
    """``engine``'s scheduler (made on first use, with the engine's ``max_rows``)."""
    scheduler = engine.__dict__.get("_mizuoto_scheduler")
    if scheduler is None:
        with _MAKING:
            scheduler = engine.__dict__.setdefault(
                "_mizuoto_scheduler",
                Scheduler(engine, max_rows=engine.max_rows,
                          admission_wait=getattr(engine, "admission_wait", 0.0)))
    return scheduler


_MAKING = threading.Lock()

__all__ = ["ARRIVAL_QUIET", "DEFAULT_MAX_ROWS", "DEFAULT_QUEUE_SIZE", "MAX_WAITING", "Row", "Scheduler",
           "StepStats", "scheduler_for"]
