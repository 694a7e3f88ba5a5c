"""Files from outside that must be plain files: ``/dev/zero`` never ends, a FIFO blocks, a
``/proc`` or ``/sys`` file says it is empty yet reads on; a training path or ``--text-file``
pointing at one would hang or fill memory. :func:`check_regular` refuses them by what the
file is, checked on the open descriptor where there is one (a file swapped in between cannot
slip past)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: kernel file systems: their files claim a size (often 0) that is not what reading gives
_KERNEL_ROOTS = ("/proc", "/sys", "/dev")


class NotARegularFile(ValueError):
    """The path is a device, a pipe, a directory or a kernel file; ``str`` names it."""


def check_regular(path: str | Path, fd: int | None = None, source: str | None = None) -> None:
    """Raise :class:`NotARegularFile` unless ``path`` (or the open descriptor ``fd``) is a
    regular file outside the kernel's file systems. An ``OSError`` (missing, no permission)
    passes through."""
    info = os.fstat(fd) if fd is not None else os.stat(path)
    real = os.path.realpath(path)
    if not stat.S_ISREG(info.st_mode) or any(real == root or real.startswith(root + os.sep)
                                             for root in _KERNEL_ROOTS):
        raise NotARegularFile(f"{source or path} is not a regular file (a device, pipe, "
                              "directory or kernel file): give a file")


def open_regular(path: str | Path, source: str | None = None):
    """``path`` opened for binary reading once :func:`check_regular` accepts it (before the
    open, which would block on a FIFO, and again on the descriptor)."""
    check_regular(path, source=source)
    handle = open(path, "rb")
    try:
        check_regular(path, handle.fileno(), source)
    except BaseException:
        handle.close()
        raise
    return handle
