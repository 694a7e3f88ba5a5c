"""How much memory the system can still give, and giving back what this process has freed.

glibc keeps freed blocks below its mmap threshold (32 MB at most) in the process's heap: after
a real-size VoxCPM2 LoRA step the process held about 10 GB it no longer used (no live tensor),
``MemAvailable`` counted it as taken, and the export's preview was refused by the memory guard
although the model fitted.
`available_memory(needed)` therefore gives that memory back (`release_freed_memory`) before it
reports too little.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory(needed: int | None = None) -> int | None:
    """Bytes of memory the system can still give (``MemAvailable``), or None where unknown.
    With ``needed`` more than that, the memory this process has freed is given back first and
    the figure read again."""
    available = _mem_available()
    if needed is not None and available is not None and needed > available:
        release_freed_memory()
        available = _mem_available()
    return available


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and others lack it
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Collect Python's reference cycles and return the heap's free blocks to the system
    (glibc's ``malloc_trim``; nothing more where the C library lacks it). The arithmetic and
    every live object are untouched."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
