"""Atomic writes: a file or a directory appears whole or not at all."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; give the result the permissions a plain open() would.
    os.chmod(tmp_path, 0o666 & ~_umask())
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; fill it, and on success it
    replaces ``path`` whole, whether or not ``path`` exists (an export written again over
    the last one). On an error nothing changes and the temporary directory is removed.

    Renaming a directory over a non-empty one fails, so an existing ``path`` is swapped with
    the new one in one step where the system can (Linux ``renameat2(RENAME_EXCHANGE)``), else
    moved aside first (a crash in between leaves it as ``.<name>.old-*`` beside ``path``);
    the old one is then deleted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    # mkdtemp creates 0700; give the result the permissions a plain mkdir() would
    os.chmod(tmp_path, 0o777 & ~_umask())
    try:
        yield tmp_path
        if not path.exists():
            os.replace(tmp_path, path)
        elif _exchange(tmp_path, path):
            shutil.rmtree(tmp_path)  # now the old directory
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp_path, path)
            shutil.rmtree(old)
    finally:
        if tmp_path.exists():
            shutil.rmtree(tmp_path)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux 3.15+); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                     _RENAME_EXCHANGE)
    return done == 0
