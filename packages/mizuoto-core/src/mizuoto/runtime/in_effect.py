"""The compute options in effect, as a result reports them (``Applied.compute``)."""

from __future__ import annotations

import functools
from typing import Any

from mizuoto.runtime.allocator import loaded_allocator
from mizuoto.runtime.threads import cpu_wait_policy, openmp_binding


def compute_in_effect(**engine_options: Any) -> dict[str, Any]:
    """``Applied.compute`` for a result made now: the process-wide CPU settings every engine
    shares (``cpu_threads``: torch's thread count; ``cpu_allocator``: ``jemalloc``,
    ``tcmalloc`` or ``default``, the one that provides malloc; ``cpu_pinning``: whether
    torch's threads are bound to cores; ``cpu_wait_policy``: ``passive``, ``active`` or
    ``default``, how its idle threads wait), then the options the engine itself applies
    (``compile=True``, ``attention="fast"``, ``oom_fallback=...``), which win.

    Read when the result is made, not at load: the thread count is torch's global setting,
    which another engine loaded later in the same process may change.
    """
    import torch

    return {"cpu_threads": torch.get_num_threads(),
            "cpu_allocator": _allocator(),
            "cpu_pinning": openmp_binding() is not None,
            "cpu_wait_policy": cpu_wait_policy(),
            **engine_options}


@functools.cache
def _allocator() -> str:
    # fixed once the process has started (LD_PRELOAD): the memory map is read once
    return loaded_allocator() or "default"
