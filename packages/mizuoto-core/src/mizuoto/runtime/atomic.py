"""Atomic writes: a file appears whole or not at all, with the permissions ``open()`` gives.

Files and folders Mizuoto writes for the user follow the process umask, like any other tool
(``mkstemp`` and ``mkdtemp`` make 0600 / 0700: :func:`file_mode` and :func:`directory_mode`
are what a plain ``open()`` / ``mkdir()`` would give instead).

The path the user named is honoured: a symlink is written through (its target is replaced, the
link stays), and a device, FIFO or socket is written into as ``cat > path`` would, never
replaced by a regular file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open()`` under the process umask (0644 under 022)."""
    return 0o666 & ~_umask()


def directory_mode() -> int:
    """The mode a new folder gets from ``mkdir()`` under the process umask (0755 under 022)."""
    return 0o777 & ~_umask()


def is_special(path: Path) -> bool:
    """Whether ``path`` (links followed) is a device, FIFO or socket: written into in place."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``.

    A symlink ``path`` is written through (its target is replaced atomically; the link stays).
    A device, FIFO or socket gets the finished bytes written into it (no rename is possible).
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if is_special(path):
        with _written_into(path) as tmp:
            yield tmp
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # after the write: a writer may have replaced the file (safetensors makes it 0600)
        os.chmod(tmp_path, file_mode())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def save_safetensors(tensors, path: str | Path, *, metadata: dict[str, str] | None = None
                     ) -> Path:
    """safetensors' ``save_file``, atomically and with the mode ``open()`` gives: ``save_file``
    itself makes 0600 files, whatever the umask."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


@contextlib.contextmanager
def _written_into(path: Path) -> Iterator[Path]:
    """A private temporary file (the system's temp folder), copied into ``path`` on success."""
    fd, tmp = tempfile.mkstemp(suffix=path.suffix)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as source, open(path, "wb") as target:
            shutil.copyfileobj(source, target)
    finally:
        tmp_path.unlink(missing_ok=True)
