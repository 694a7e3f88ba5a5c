"""CPU threads and memory allocator (``compute.cpu_threads``, ``compute.cpu_allocator``).

Results on the CPU depend on the thread count (reductions split differently), so parity runs
fix it. jemalloc and tcmalloc replace malloc only when preloaded (``LD_PRELOAD``) before the
process starts; Mizuoto cannot switch them on, only tell whether they are in use.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mizuoto.options import ComputeOptions

logger = logging.getLogger(__name__)

_ALLOCATOR_LIBRARIES = {"jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc"}


def apply_cpu_threads(compute: ComputeOptions) -> int:
    """Set torch's intra-op thread count from ``compute.cpu_threads``; return the count in use.

    ``None`` leaves torch's default (the number of cores, or ``OMP_NUM_THREADS``).
    """
    if compute.cpu_threads is not None and torch.get_num_threads() != compute.cpu_threads:
        torch.set_num_threads(compute.cpu_threads)
        logger.debug("torch.set_num_threads(%d)", compute.cpu_threads)
    return torch.get_num_threads()


def loaded_allocator(maps: str | Path = "/proc/self/maps") -> str | None:
    """``"jemalloc"`` or ``"tcmalloc"`` if mapped into this process, else ``None``.

    Reads the memory map (Linux); elsewhere it returns ``None``.
    """
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for name, library in _ALLOCATOR_LIBRARIES.items():
        if library in text:
            return name
    return None


def check_cpu_allocator(compute: ComputeOptions, *, maps: str | Path = "/proc/self/maps"
                        ) -> str | None:
    """A warning when ``compute.cpu_allocator`` asks for an allocator that is not loaded."""
    wanted = compute.cpu_allocator
    if wanted == "default":
        return None
    loaded = loaded_allocator(maps)
    if loaded == wanted:
        return None
    library = _ALLOCATOR_LIBRARIES[wanted]
    return (
        f"compute.cpu_allocator={wanted} asked for, but {library} is not loaded "
        f"({'using ' + loaded if loaded else 'using the system malloc'}); start the process "
        f"with LD_PRELOAD=/path/to/{library}.so to use it"
    )
