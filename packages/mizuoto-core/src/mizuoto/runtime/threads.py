"""CPU threads: their count (``compute.cpu_threads``), their binding to cores
(``compute.cpu_pinning``) and how they wait when idle (``compute.cpu_wait_policy``).

Results on the CPU depend on the thread count (reductions split differently), so parity runs
fix it; which cores the threads run on changes nothing in the arithmetic. torch's intra-op
threads are OpenMP threads, and OpenMP reads its binding (``OMP_PROC_BIND``, ``OMP_PLACES``)
once, when torch is imported: from Python pinning can only be checked, not switched on; the
``mizuoto`` command restarts itself with it (:mod:`mizuoto.runtime.startup`). torch is imported
only by the functions that need it, so the command can decide before loading it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

from mizuoto.errors import InvalidOption
from mizuoto.options import ComputeOptions

logger = logging.getLogger(__name__)

#: What ``compute.cpu_pinning`` sets before OpenMP starts: thread i on core i of the cores
#: this process may use (one thread per physical core, hyperthread siblings left to it).
PINNING_ENVIRONMENT = MappingProxyType({"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"})

# omp_proc_bind_t (OpenMP 4.5): 0 is omp_proc_bind_false
_BINDINGS = {1: "true", 2: "primary", 3: "close", 4: "spread"}
_OPENMP_LIBRARY = re.compile(r"/lib(gomp|iomp5|omp)[-.\w]*\.so[.\d]*$")


def apply_cpu_threads(compute: ComputeOptions) -> int:
    """Set torch's intra-op thread count from ``compute.cpu_threads``; return the count in use.

    ``None`` leaves torch's default (the number of cores, or ``OMP_NUM_THREADS``).
    """
    import torch

    if compute.cpu_threads is not None and torch.get_num_threads() != compute.cpu_threads:
        torch.set_num_threads(compute.cpu_threads)
        logger.debug("torch.set_num_threads(%d)", compute.cpu_threads)
    return torch.get_num_threads()


@functools.cache
def openmp_binding() -> str | None:
    """How torch's OpenMP runtime binds its threads to cores (``"close"``, ``"spread"``, ...),
    or ``None`` when it does not (or torch's threads are not OpenMP threads).

    Asked of the runtime itself (``omp_get_proc_bind``), so it is what is in effect, however
    the environment was set. Fixed once OpenMP has started, hence cached.
    """
    import torch

    library = _openmp_library(Path(torch.__file__).parent)
    if library is None:
        return None
    try:
        bind = ctypes.CDLL(library).omp_get_proc_bind()
    except (OSError, AttributeError):
        return None
    return _BINDINGS.get(bind)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """For the block, torch runs on ``count`` intra-op threads (``torch.set_num_threads``: the
    process's count, MKL's too), as a data-loader worker runs on one: a sum split over more
    threads adds in another order, so features computed like a worker's need its count."""
    import torch

    before = torch.get_num_threads()
    if before != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if before != count:
            torch.set_num_threads(before)


@contextmanager
def thread_intra_op_threads(count: int) -> Iterator[int]:
    """For the block, this thread's torch ops run on ``count`` intra-op threads; other threads'
    count is unchanged. Yields the count in effect: unchanged where torch's threads are not
    OpenMP's (this is OpenMP's per-thread ``omp_set_num_threads``, which
    ``torch.set_num_threads`` would make every new thread's default too).

    Only OpenMP-parallel work widens (oneDNN's, so bfloat16 matrix products, and torch's own
    element-wise and convolution loops); MKL's float32 matrix products keep the count torch
    gave them.
    """
    import torch

    before = torch.get_num_threads()  # also runs torch's setup of this thread's count first
    runtime = _openmp_runtime()
    if runtime is None or count == before:
        yield before
        return
    runtime.omp_set_num_threads(count)
    try:
        yield count
    finally:
        runtime.omp_set_num_threads(before)


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """torch's OpenMP runtime, when its intra-op threads are OpenMP's."""
    import torch

    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    library = _openmp_library(Path(torch.__file__).parent)
    try:
        runtime = ctypes.CDLL(library) if library else None
        if runtime is not None:
            runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
        return runtime
    except (OSError, AttributeError):
        return None


def _openmp_library(torch_dir: Path, maps: str | Path = "/proc/self/maps") -> str | None:
    """The OpenMP runtime mapped into this process, torch's own copy first."""
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return None
    found = sorted({line.split(maxsplit=5)[5] for line in lines
                    if len(line.split(maxsplit=5)) == 6 and _OPENMP_LIBRARY.search(line)},
                   key=lambda path: not path.startswith(str(torch_dir)))
    return found[0] if found else None


def check_cpu_pinning(compute: ComputeOptions) -> None:
    """Raise :class:`InvalidOption` when ``compute.cpu_pinning`` is asked for but torch's
    threads are not bound to cores (OpenMP started without a binding)."""
    if not compute.cpu_pinning or openmp_binding() is not None:
        return
    settings = " ".join(f"{k}={v}" for k, v in PINNING_ENVIRONMENT.items())
    raise InvalidOption("compute.cpu_pinning", "torch's threads are not bound to cores: "
                        "OpenMP reads its binding once, when torch is imported; start the "
                        f"process with {settings} (e.g. {settings} python ...) or set them in "
                        "os.environ before importing torch, or use the mizuoto command, which "
                        "restarts itself with them")


# --- how idle threads wait ----------------------------------------------------------------------

#: OpenMP's wait policy, read once by torch's OpenMP runtime (libgomp) when torch is imported.
#: ``ACTIVE`` threads spin between parallel regions; ``PASSIVE`` ones sleep at once. libgomp's
#: default spins about 300,000 times first: on a busy machine each spinning thread takes a core
#: from the process it waits on, and a request slows down far more than the load (a 6-second
#: request took 37-89 s at load 3 on 2 cores, passive degrades in proportion to the load). On
#: an idle machine the other way round: passive wakes a sleeping thread for each of a decode
#: step's hundreds of short regions, 1.5x slower than spinning. The policy changes when
#: threads sleep, never the arithmetic.
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"

#: ``auto`` spins only where other work leaves the threads' cores idle: it may keep at most
#: this much of one core busy (measured: one CPU-bound process beside a spinning request on 2
#: cores made it 4x slower, so any steady neighbour means passive).
IDLE_MARGIN_CORES = 0.3
#: How long the start-up looks at the CPUs (``/proc/stat``) to see what else runs.
IDLE_WINDOW_S = 0.1


PROC_STAT = Path("/proc/stat")


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies of ``cpus`` from ``/proc/stat``; None where it cannot be read."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def busy_cores(window: float = IDLE_WINDOW_S) -> float | None:
    """How many of this process's CPUs other work keeps busy: the non-idle share of their
    time over ``window`` seconds (this process sleeps meanwhile; a hypervisor's steal counts
    as busy), times their count. None where ``/proc/stat`` is not there (not Linux)."""
    import time

    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    before = _cpu_ticks(cpus)
    if before is None:
        return None
    time.sleep(window)
    after = _cpu_ticks(cpus)
    if after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * len(cpus)


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def cpu_quota_cores() -> float | None:
    """This process's CPU quota in cores (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``: a container's ``--cpus``); None where there is none or it cannot be
    read."""
    folders = []
    with contextlib.suppress(OSError, ValueError):
        for line in PROC_SELF_CGROUP.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                folders.append(("v2", CGROUP_ROOT / path.lstrip("/")))
            elif "cpu" in controllers.split(","):
                folders.append(("v1", CGROUP_ROOT / "cpu" / path.lstrip("/")))
    folders += [("v2", CGROUP_ROOT), ("v1", CGROUP_ROOT / "cpu")]  # a container's own view
    for kind, folder in folders:
        try:
            if kind == "v2":
                quota, period = (folder / "cpu.max").read_text().split()[:2]
                return None if quota == "max" else int(quota) / int(period)
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            return quota / int((folder / "cpu.cfs_period_us").read_text()) if quota > 0 else None
        except (OSError, ValueError, ZeroDivisionError):
            continue
    return None


def auto_wait_policy(threads: int, cpus: int, busy: float | None, *, serving: bool,
                     quota: float | None = None) -> str:
    """What ``compute.cpu_wait_policy=auto`` sets: ``PASSIVE`` for a server (it lives while
    the machine's load changes under it), under a CPU ``quota`` (spinning threads spend it:
    the process is throttled), wherever the idle cores cannot be seen, and where other work
    keeps more than :data:`IDLE_MARGIN_CORES` of the cores the threads need busy; ``ACTIVE``
    (spin) on an idle machine, where it is 1.5x faster."""
    if serving or busy is None or quota is not None:
        return "PASSIVE"
    return "ACTIVE" if busy + min(threads, cpus) <= cpus + IDLE_MARGIN_CORES else "PASSIVE"


def wait_policy_environment(compute: ComputeOptions, environ: Mapping[str, str], *,
                            serving: bool = True,
                            busy: Callable[[], float | None] = busy_cores,
                            quota: Callable[[], float | None] = cpu_quota_cores
                            ) -> dict[str, str]:
    """The variables to set before torch is imported for ``compute.cpu_wait_policy``: ``auto``
    keeps an ``OMP_WAIT_POLICY`` already set (the user's choice), else takes
    :func:`auto_wait_policy` (``serving``: a server's process; ``quota`` and ``busy`` are
    asked only for one that is not, ``busy`` only without a quota); ``passive``/``active``
    set it. Empty when nothing is to change."""
    wanted = compute.cpu_wait_policy
    current = environ.get(WAIT_POLICY_ENV)
    if wanted == "auto":
        if current is not None:
            return {}
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        asked = re.match(r"\s*(\d+)", environ.get("OMP_NUM_THREADS", ""))
        threads = compute.cpu_threads or (int(asked.group(1)) if asked else 0) or cpus
        limit = None if serving else quota()
        seen = None if serving or limit is not None else busy()
        policy = auto_wait_policy(threads, cpus, seen, serving=serving, quota=limit)
        if serving:
            why = "a server"
        elif limit is not None:
            why = f"a CPU quota of {limit:.2f} cores"
        else:
            why = "busy cores unknown" if seen is None else f"{seen:.2f} cores busy"
        logger.debug("compute.cpu_wait_policy=auto: %s (%s, %d threads on %d cores)",
                     policy.lower(), why, threads, cpus)
        return {WAIT_POLICY_ENV: policy}
    return {} if (current or "").lower() == wanted else {WAIT_POLICY_ENV: wanted.upper()}


def apply_cpu_wait_policy(compute: ComputeOptions) -> None:
    """Make ``compute.cpu_wait_policy`` (``passive`` or ``active``) take effect: set
    ``OMP_WAIT_POLICY`` when torch is not imported yet (OpenMP reads it then), else raise
    :class:`InvalidOption` when the process runs with another one. ``auto`` changes nothing
    here (the ``mizuoto`` command sets it, :func:`wait_policy_environment`)."""
    if compute.cpu_wait_policy == "auto":
        return
    changes = wait_policy_environment(compute, os.environ)
    if not changes:
        return
    if "torch" not in sys.modules:
        os.environ.update(changes)
        return
    setting = f"{WAIT_POLICY_ENV}={changes[WAIT_POLICY_ENV]}"
    raise InvalidOption("compute.cpu_wait_policy", f"torch's threads run with "
                        f"{WAIT_POLICY_ENV}={os.environ.get(WAIT_POLICY_ENV, 'unset')}: OpenMP "
                        "reads it once, when torch is imported; start the process with "
                        f"{setting} (e.g. {setting} python ...) or set it in os.environ before "
                        "importing torch, or use the mizuoto command, which sets it")


@functools.cache
def cpu_wait_policy() -> str:
    """The wait policy torch's threads run with as ``Applied.compute`` reports it:
    ``passive``, ``active`` or ``default`` (libgomp's spin-then-sleep), as ``OMP_WAIT_POLICY``
    says when this is first asked (once torch is imported, OpenMP has read it)."""
    value = os.environ.get(WAIT_POLICY_ENV, "").strip().lower()
    return value if value in ("passive", "active") else "default"
