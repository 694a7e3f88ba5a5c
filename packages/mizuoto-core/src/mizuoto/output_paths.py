"""Checking where an output will go before any model loads.

A command that loads a model and synthesizes for minutes must not fail at the end because its
output cannot be written. :func:`check_output_file` and :func:`check_output_dir` find the
problems that can be known in advance (a read-only or missing folder, a path under a regular
file, a folder where a file should go, an extension no writer knows) and raise
:class:`~mizuoto.errors.OutputNotWritable` naming the option; what only the write itself can
tell (a full disk) is reported when it happens.
"""

from __future__ import annotations

import os
from pathlib import Path

from mizuoto.errors import OutputNotWritable
from mizuoto.runtime.atomic import is_special

#: Names Windows keeps for devices, whatever the extension: "nul.wav" cannot be a file there.
WINDOWS_DEVICE_NAMES = frozenset({"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                                  *(f"LPT{i}" for i in range(1, 10))})


def is_device_name(name: str) -> bool:
    """Whether a file named ``name`` (any extension, any case) is a device on Windows."""
    return name.split(".")[0].upper() in WINDOWS_DEVICE_NAMES


def check_output_file(path: str | Path, field: str, *, special_ok: bool = True) -> Path:
    """Raise :class:`OutputNotWritable` for ``field`` unless a file can be written at
    ``path``. A symlink is checked where it points (it is written through); a device or FIFO
    is accepted when it is writable (written into in place), unless ``special_ok`` is False
    (outputs that keep files beside them, e.g. long-form's ``OUT.part/``)."""
    if str(path).endswith(("/", os.sep)):  # Path() would drop the slash that says "a folder"
        raise OutputNotWritable(field, f"{path} ends with a slash (a folder)",
                                "name a file: drop the trailing slash")
    path = Path(path)
    target = path.resolve() if path.is_symlink() else path
    if target.is_dir():
        raise OutputNotWritable(field, f"{path} is a folder", "name a file in it")
    if is_special(target):
        if not special_ok:
            raise OutputNotWritable(field, f"{path} is not a regular file (a device or FIFO)",
                                    "name a regular file: this output keeps files beside it")
        if not os.access(target, os.W_OK):
            raise OutputNotWritable(field, f"{path} is not writable")
        return path
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputNotWritable(field, f"{path} is read-only", "name another file")
    _check_folder(target.parent, field, path)
    return path


def check_distinct(output: tuple[str, str | Path | None],
                   *others: tuple[str, str | Path | None]) -> None:
    """Raise :class:`OutputNotWritable` when the ``(field, path)`` output names the same file
    as one of ``others`` (inputs it would overwrite, or another output that one would
    replace): through links, ``..`` and hard links. Unset (None) paths are skipped."""
    field, path = output
    if path is None:
        return
    for other_field, other in others:
        if other is not None and _same_file(Path(path), Path(other)):
            raise OutputNotWritable(field, f"{path} is also {other_field}",
                                    f"write {field} to another file")


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet: not one file
        return False


def check_output_dir(path: str | Path, field: str) -> Path:
    """Raise :class:`OutputNotWritable` for ``field`` unless ``path`` is, or can be created
    as, a folder to write files in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputNotWritable(field, f"{path} is not a folder", "name a folder")
    _check_folder(path, field, path)
    return path


def _check_folder(folder: Path, field: str, named: Path) -> None:
    """``folder`` must be a writable folder, or creatable under its nearest existing one."""
    folder = Path(os.path.abspath(folder))
    existing = folder
    while not existing.exists():  # the folders atomic writes would create
        if existing.is_symlink():  # a dangling link in the way
            raise OutputNotWritable(field, f"{existing} is a broken link",
                                    f"fix it or write {named} elsewhere")
        existing = existing.parent
    if not existing.is_dir():
        raise OutputNotWritable(field, f"{existing} is a file, not a folder",
                                f"write {named} elsewhere")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputNotWritable(field, f"cannot write in {existing} (permission denied or a "
                                "read-only file system)", f"write {named} elsewhere")
