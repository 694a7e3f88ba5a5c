"""One run at a time per output: a lock file that names its holder.

Two runs writing one output (a batch folder, a long-form ``OUT.part/``) would interleave their
work and leave records that describe the other run's files. :class:`RunLock` holds an
exclusive ``flock`` on a file in the folder and writes ``pid N on HOST`` into it, so a second
run is refused naming the first. The kernel drops the lock when its process ends, however it
ends: a lock file left by a killed run is stale and simply taken over. The file is removed on
release (after checking, on taking it, that the file locked is still the one at the path).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

from mizuoto.errors import InvalidRequest

log = logging.getLogger(__name__)


class RunLock:
    """An exclusive lock on ``path`` for a run writing ``what``; ``field`` names the request
    field a refusal is reported against. Use as a context manager, or :meth:`acquire` /
    :meth:`release`."""

    def __init__(self, path: str | Path, *, field: str, what: str) -> None:
        self.path = Path(path)
        self.field = field
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    # a file system without locks (some network mounts): go on unlocked
                    log.warning("cannot lock %s (%s): two runs into %s would not be stopped",
                                self.path, exc.strerror, self.what)
                    return self
                raise InvalidRequest(
                    self.field, f"another run ({holder or 'a process starting up'}) is "
                    f"writing {self.what}", "wait for it to finish, or write elsewhere") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed it as we opened it: take the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()
