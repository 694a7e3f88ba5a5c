"""Several listeners of one model at once, as a server has them: for tests and benchmarks of
the scheduler's batching (one thread taking turns, or a thread per listener)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


def round_robin(streams: Iterable[Iterable]) -> list[list]:
    """Take one item of each open stream in turn, in this thread, until all have ended; each
    stream's items in order. How one thread serves several listeners: a batching engine
    steps the streams together (they join one by one as their first chunks are asked for)."""
    iterators = [iter(stream) for stream in streams]
    items: list[list] = [[] for _ in iterators]
    open_ = list(range(len(iterators)))
    while open_:
        for index in list(open_):
            item = next(iterators[index], _END)
            if item is _END:
                open_.remove(index)
            else:
                items[index].append(item)
    return items


def listen_together(streams: Iterable[Callable[[], Iterable]], *,
                    timeout: float | None = None) -> list[list]:
    """Consume each stream (``streams``: callables that open one) on its own thread, all
    started together, as a server's listeners connecting at once: a batching engine admits
    them in one step. Each stream's items in order; the first error of any is raised, and
    ``TimeoutError`` when a listener is still going after ``timeout`` seconds."""
    opens = list(streams)
    results: list = [None] * len(opens)
    errors: list[BaseException] = []
    start = threading.Barrier(len(opens))

    def listen(index: int) -> None:
        try:
            start.wait()
            results[index] = list(opens[index]())
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=listen, args=(i,), daemon=True)
               for i in range(len(opens))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"a listener was still streaming after {timeout} s")
    if errors:
        raise errors[0]
    return results


_END = object()
