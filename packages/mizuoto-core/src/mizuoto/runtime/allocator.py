"""The CPU memory allocator (``compute.cpu_allocator``): find jemalloc or tcmalloc on the system
and tell whether one is in use.

An allocator replaces malloc only when the dynamic linker preloads it (``LD_PRELOAD``) as the
process starts: a running Python cannot switch. So from Python a load that asks for one that
is not loaded is refused with the command to start with it; the ``mizuoto`` command restarts
itself with it preloaded (:mod:`mizuoto.runtime.startup`). The allocator changes where memory
comes from, not any arithmetic: torch's CPU tensors are 64-byte aligned under every malloc, so
results stay bit-identical. Linux only. Imports no torch (the command decides before loading).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path

from mizuoto.errors import InvalidOption

logger = logging.getLogger(__name__)

#: Files or directories searched first (``:``-separated), before the linker cache and the
#: usual library directories.
ALLOCATOR_PATH_ENV = "MIZUOTO_ALLOCATOR_PATH"

# The shared libraries that replace malloc (not the _debug builds, which check every call);
# gperftools' tcmalloc_minimal is tcmalloc without the heap profiler.
_LIBRARY_NAMES = {
    "jemalloc": re.compile(r"libjemalloc\.so(\.\d+)*"),
    "tcmalloc": re.compile(r"libtcmalloc(_minimal)?\.so(\.\d+)*"),
}
_INSTALL = {
    "jemalloc": "apt-get install libjemalloc2 (Debian, Ubuntu), dnf install jemalloc (Fedora), "
                "or conda install jemalloc",
    "tcmalloc": "apt-get install libtcmalloc-minimal4 (Debian, Ubuntu), dnf install "
                "gperftools-libs (Fedora), or conda install gperftools",
}


def library_directories() -> list[Path]:
    """The usual places for system libraries, for this interpreter's architecture."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    prefixes = [Path(sys.prefix) / "lib"]  # a conda environment's own libraries
    system = ["/usr/local/lib", "/usr/lib", "/lib", "/usr/lib64", "/lib64"]
    if multiarch:
        system = [f"/usr/local/lib/{multiarch}", f"/usr/lib/{multiarch}", f"/lib/{multiarch}",
                  *system]
    return prefixes + [Path(p) for p in system]


def find_allocator_library(name: str, *, environ: Mapping[str, str] | None = None
                           ) -> Path | None:
    """The shared library of allocator ``name`` (``"jemalloc"`` or ``"tcmalloc"``), or ``None``.

    Searched in order: ``$MIZUOTO_ALLOCATOR_PATH`` (files or directories, ``:``-separated),
    the dynamic linker's cache (``ldconfig -p``), then :func:`library_directories`. A file
    built for another architecture (a 32-bit library in the cache) is passed over.
    """
    if name not in _LIBRARY_NAMES:
        raise ValueError(f"unknown allocator {name!r}; known: {', '.join(_LIBRARY_NAMES)}")
    environ = os.environ if environ is None else environ
    pattern = _LIBRARY_NAMES[name]
    for candidate in _candidates(environ.get(ALLOCATOR_PATH_ENV, "")):
        if pattern.fullmatch(candidate.name) and _loadable(candidate):
            logger.debug("%s: %s", name, candidate)
            return candidate
    return None


def _candidates(override: str) -> Iterator[Path]:
    for entry in filter(None, override.split(":")):
        path = Path(entry)
        yield from _listing(path) if path.is_dir() else [path]
    yield from _linker_cache()
    for directory in library_directories():
        yield from _listing(directory)


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:  # absent or unreadable
        return []


def _linker_cache() -> list[Path]:
    """The libraries ``ldconfig -p`` lists (``\\tlibjemalloc.so.2 (libc6,x86-64) => /path``)."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    if ldconfig is None:
        return []
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10,
                                 check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [Path(line.rpartition(" => ")[2].strip()) for line in listing.splitlines()
            if " => " in line]


def _loadable(path: Path) -> bool:
    """An ELF file of this interpreter's class and machine (what ``LD_PRELOAD`` can load)."""
    try:
        with open(path, "rb") as library, open(sys.executable, "rb") as interpreter:
            ours, theirs = interpreter.read(20), library.read(20)
    except OSError:
        return False
    # e_ident class (byte 4) and byte order (5), e_machine (bytes 18-19)
    return theirs[:4] == b"\x7fELF" and (theirs[4:6], theirs[18:20]) == (ours[4:6], ours[18:20])


def malloc_library(maps: str | Path = "/proc/self/maps", *, address: int | None = None
                   ) -> str | None:
    """The file that provides ``malloc`` to this process (the mapping holding the address the
    dynamic linker resolves it to), or ``None`` where there is no memory map (not Linux)."""
    if address is None:
        address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        low, _, high = fields[0].partition("-")
        if len(fields) == 6 and int(low, 16) <= address < int(high, 16):
            return fields[5].strip()
    return None


def loaded_allocator(maps: str | Path = "/proc/self/maps", *, address: int | None = None
                     ) -> str | None:
    """``"jemalloc"`` or ``"tcmalloc"`` when it provides this process's ``malloc``, else
    ``None`` (the system malloc, or not Linux).

    The library that ``malloc`` resolves to, not merely one that is mapped: with two preloaded,
    the first wins.
    """
    library = malloc_library(maps, address=address)
    return _allocator_of(library) if library else None


def _allocator_of(path: str) -> str | None:
    """The allocator a library file belongs to (any build of it, a _debug one too)."""
    name = Path(path).name
    return next((n for n in _LIBRARY_NAMES if name.startswith(f"lib{n}")), None)


def preload_list(library: Path, preloaded: str = "") -> str:
    """An ``LD_PRELOAD`` value with ``library`` first and the rest of ``preloaded`` after it,
    less any other allocator (a second malloc: the first one would win anyway)."""
    # the dynamic linker splits LD_PRELOAD at colons and spaces
    others = [entry for entry in preloaded.replace(" ", ":").split(":")
              if entry and _allocator_of(entry) is None]
    return ":".join([str(library), *others])


def install_hint(name: str) -> str:
    """How to get allocator ``name`` onto the system."""
    return f"install it ({_INSTALL[name]}) or set {ALLOCATOR_PATH_ENV} to the library file"


def _preload_fix(name: str, library: Path | None) -> str:
    """The fix for an allocator that is not loaded: how to start the process with it."""
    if library is None:
        return f"no lib{name} was found on this system: {install_hint(name)}; then start the " \
               f"process with LD_PRELOAD=/path/to/lib{name}.so, or use the mizuoto command, " \
               f"which restarts itself with it"
    return f"start the process with it preloaded, e.g. LD_PRELOAD={library} python ..., or " \
           f"use the mizuoto command, which restarts itself with it"


def check_cpu_allocator(requested: str, *, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`InvalidOption` when ``compute.cpu_allocator`` asks for an allocator this
    process is not running with: it must be preloaded before the process starts."""
    if requested == "default":
        return
    loaded = loaded_allocator()
    if loaded == requested:
        return
    if not sys.platform.startswith("linux"):
        raise InvalidOption("compute.cpu_allocator", f"{requested} is supported on Linux only "
                            "(preloaded with LD_PRELOAD); leave it at 'default'")
    environ = os.environ if environ is None else environ
    using = f"this process uses {loaded}" if loaded else "this process uses the system malloc"
    preloaded = environ.get("LD_PRELOAD", "")
    if _LIBRARY_NAMES[requested].search(preloaded):
        raise InvalidOption("compute.cpu_allocator", f"{requested} is not loaded ({using}) "
                            f"although LD_PRELOAD={preloaded}: the dynamic linker could not "
                            "preload it (its message is on stderr at start: check the path), "
                            "or another malloc comes before it")
    raise InvalidOption("compute.cpu_allocator", f"{requested} is not loaded ({using}); an "
                        "allocator replaces malloc only when preloaded before the process "
                        f"starts: {_preload_fix(requested, find_allocator_library(requested, environ=environ))}")
