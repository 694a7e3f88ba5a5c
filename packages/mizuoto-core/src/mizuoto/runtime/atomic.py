"""Atomic writes: a file or a directory appears whole or not at all, with the permissions
``open()`` / ``mkdir()`` give.

Files and folders Mizuoto writes for the user follow the process umask, like any other tool
(``mkstemp`` and ``mkdtemp`` make 0600 / 0700: :func:`file_mode` and :func:`directory_mode`
are what a plain ``open()`` / ``mkdir()`` would give instead).

The path the user named is honoured: a symlink is written through (its target is replaced, the
link stays), and a device, FIFO or socket is written into as ``cat > path`` would, never
replaced by a regular file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mizuoto.errors import DiskFull


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


#: errno values of a write that failed for its disk, not for its caller
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
# below this many free bytes a writer's errno-less "System error." is taken as a full disk
_NEARLY_FULL = 1 << 20


def storage_error(exc: BaseException, path: str | Path) -> DiskFull | None:
    """The :class:`DiskFull` that ``exc`` (or an exception it was raised from) stands for, or
    None when it is not a disk's failure. Writers hide the errno in their own types:
    soundfile's ``LibsndfileError`` says "System error." (cffi keeps the errno of the C call
    that failed), safetensors' ``SafetensorError`` spells the io error out in its text."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain of causes, never a cycle of contexts
        if seen is None:
            break
        if isinstance(seen, DiskFull):
            return seen
        if isinstance(seen, OSError) and seen.errno in STORAGE_ERRNOS:
            return DiskFull(str(path), seen.errno)
        code = _writer_errno(seen, Path(path))
        if code is not None:
            return DiskFull(str(path), code)
        seen = seen.__cause__ or seen.__context__
    return None


def _writer_errno(exc: BaseException, path: Path) -> int | None:
    kind, text = type(exc).__name__, str(exc)
    if kind == "SafetensorError":  # "I/O error: No space left on device (os error 28)"
        found = re.search(r"os error (\d+)", text)
        code = int(found.group(1)) if found else None
        return code if code in STORAGE_ERRNOS else None
    if kind != "LibsndfileError" or getattr(exc, "code", None) != 2:  # SFE_SYSTEM
        return None
    try:
        import soundfile

        code = soundfile._ffi.errno
    except (ImportError, AttributeError):
        code = 0
    if code in STORAGE_ERRNOS:
        return code
    try:
        disk = os.statvfs(path.parent)
        free = disk.f_bavail * disk.f_frsize
    except OSError:
        return None
    return errno.ENOSPC if free < _NEARLY_FULL else None


@contextlib.contextmanager
def storage_errors_named(path: str | Path) -> Iterator[None]:
    """Re-raise a disk's failure inside the block as :class:`DiskFull` naming ``path``."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        named = storage_error(exc, path)
        if named is None:
            raise
        raise named from exc


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
        with storage_errors_named(path), _written_into(path) as tmp:
            yield tmp
        return
    with storage_errors_named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix,
                                   dir=path.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        with storage_errors_named(path):
            yield tmp_path
            # after the write: a writer may have replaced the file (safetensors makes it 0600)
            os.chmod(tmp_path, file_mode())
            os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_directory(path: str | Path, *, staging: str | None = None,
                     durable: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; fill it, and on success it
    replaces ``path`` whole, whether or not ``path`` exists (an export written again over
    the last one). On an error nothing changes and the temporary directory is removed.

    Renaming a directory over a non-empty one fails, so an existing ``path`` is swapped with
    the new one in one step where the system can (Linux ``renameat2(RENAME_EXCHANGE)``), else
    moved aside first (a crash in between leaves it as ``.<name>.old-*/<name>`` beside
    ``path``: :func:`left_aside` finds it); the old one is then deleted.

    ``staging``: a fixed name for the temporary directory (one left by a crash is removed
    first), for other processes of a torchrun world to write their files into as well.
    ``durable``: the files are flushed to the disk before the rename (checkpoints: a power
    loss after the rename must not leave a directory of empty files).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if staging is None:
        tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part",
                                         dir=path.parent))
    else:
        tmp_path = path.parent / staging
        shutil.rmtree(tmp_path, ignore_errors=True)
        tmp_path.mkdir()
    os.chmod(tmp_path, directory_mode())  # mkdtemp creates 0700
    try:
        with storage_errors_named(path):
            yield tmp_path
            if durable:
                _fsync_files(tmp_path)
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


def left_aside(path: str | Path) -> Path | None:
    """The previous ``path`` that :func:`atomic_directory` moved aside, where a crash came
    before the new one was renamed into place (only where the system cannot swap the two)."""
    path = Path(path)
    for candidate in sorted(path.parent.glob(f".{path.name}.old-*/{path.name}")):
        return candidate
    return None


def _fsync_files(folder: Path) -> None:
    for child in folder.rglob("*"):
        if child.is_file() and not child.is_symlink():
            with open(child, "rb") as f:
                os.fsync(f.fileno())


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


def save_safetensors(tensors, path: str | Path, *, metadata: dict[str, str] | None = None
                     ) -> Path:
    """safetensors' ``save_file``, atomically and with the mode ``open()`` gives: ``save_file``
    itself makes 0600 files, whatever the umask."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


def copy_model_files(source: str | Path, folder: str | Path, names, *,
                     hard_link: bool = False) -> list[str]:
    """The files ``names`` that ``source`` holds (a base model's config, tokenizer, weights)
    into ``folder``, each a copy with the mode ``open()`` gives, or with ``hard_link`` a hard
    link where the file system allows one (an export beside its base model holds no second
    copy of its weights). Returns the names carried over."""
    source, folder = Path(source), Path(folder)
    carried = []
    for name in names:
        origin = source / name
        if not origin.is_file():
            continue
        try:
            if not hard_link:
                raise OSError("copy")
            os.link(origin.resolve(), folder / name)
        except OSError:
            shutil.copy2(origin, folder / name)
            os.chmod(folder / name, file_mode())
        carried.append(name)
    return carried


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
