"""The ``bf16dot`` prepack kernel: bfloat16 linear layers with torch's own bits on an AVX2 CPU
(no native bfloat16), compiled once per installation from ``kernels/bf16_dot.cpp``.

On such a CPU torch runs a bfloat16 ``F.linear`` as one float32 dot product per output, in a
fixed order (the C++ file says which), one output and one input row at a time: 5.5 ms for a
1024 → 4096 layer at ten rows on two Zen 2 cores. The kernel sums in the same order for 32
outputs and 3 rows at once, on torch's threads (0.7 ms there; 0.13 ms against 0.57 at one
row). Nothing is assumed from this: :mod:`mizuoto.runtime.prepack` uses it for a layer only
after it gave ``torch.equal`` results against ``F.linear`` on that layer at that row and
thread count, as every packed kernel.

It needs a C++ compiler and ninja (``pip install ninja``) the first time; it is built with
torch's ``cpp_extension`` into ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``),
some 30 s, then loaded from there. Without them, or on another CPU kind, the kernel is refused
once per process and the layers run ``F.linear``.
"""

from __future__ import annotations

import hashlib
import logging
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "bf16_dot.cpp"
#: compiler flags: the source's own intrinsics, and no contraction or reassociation of sums
CFLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fno-fast-math"]


def _openmp_flags() -> list[str]:
    """``-fopenmp`` where torch's CPU threads are OpenMP's: ``at::parallel_for`` is inline code
    that runs on one thread without it (the extension then uses the libgomp torch loaded)."""
    return ["-fopenmp"] if torch.backends.openmp.is_available() else []


_lock = threading.Lock()
_built: ModuleType | None = None
_refused: str | None = None


def unavailable_reason() -> str | None:
    """Why the kernel cannot run in this process without trying to build it (``None``: it
    may)."""
    if _refused is not None:
        return _refused
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX2":
        return f"torch runs this CPU's kernels at {capability}, not AVX2"
    return None


def extension() -> ModuleType:
    """The compiled kernel (built on first use); ``RuntimeError`` where it cannot be."""
    global _built, _refused
    if _built is not None:
        return _built
    with _lock:
        if _built is not None:
            return _built
        reason = unavailable_reason()
        if reason is None:
            try:
                _built = _build()
                return _built
            except Exception as exc:  # a missing compiler or ninja, a failed build: refused
                reason = f"could not build {SOURCE.name}: {exc}".splitlines()[0]
                log.info("bfloat16 dot-product kernel not available (%s): F.linear runs",
                         reason)
        _refused = reason
        raise RuntimeError(reason)


def build_name(cflags: list[str]) -> str:
    """The extension's name in torch's cache, one per source, flags and installation.

    ``cpp_extension`` keeps one build directory per name (shared by every virtualenv of a
    Python version) and rebuilds whenever the ninja file it writes there changes: that file
    names the source's path and torch's and Python's include directories. Two environments
    sharing one name (a checkout's nox venv and an installed copy) would rebuild in turn,
    half a minute on every switch; so those paths are part of the name too.
    """
    identity = [SOURCE.read_bytes(), " ".join(cflags).encode(), str(SOURCE).encode(),
                str(Path(torch.__file__).parent).encode(), torch.__version__.encode(),
                sysconfig.get_paths()["include"].encode()]
    digest = hashlib.sha256(b"\0".join(identity)).hexdigest()[:12]
    return f"mizuoto_bf16_dot_{digest}"


def _build() -> ModuleType:
    openmp = _openmp_flags()
    cflags = CFLAGS + openmp
    # cpp_extension warns on import that no CUDA runtime is found: nothing to do with a CPU
    # kernel, and not a line for the user's terminal
    cpp_log = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_log.level
    cpp_log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        name = build_name(cflags)
        if not _is_built(cpp_extension, name):
            # a pause of half a minute the user should be told of (once per installation)
            log.warning("compiling the bf16dot kernel for this machine's bfloat16 layers "
                        "(once per installation, about 30 s)")
        return cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=cflags,
                                  extra_ldflags=openmp, verbose=False)
    finally:
        cpp_log.setLevel(level)


def _is_built(cpp_extension: ModuleType, name: str) -> bool:
    """Whether torch's extension cache holds ``name`` (its private helper: False without it,
    which only says "building" once too often)."""
    try:
        directory = cpp_extension._get_build_directory(name, verbose=False)
    except Exception:
        return False
    return (Path(directory) / f"{name}.so").exists()


def pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """The packed copy of a bfloat16 ``weight`` (any row count runs on it)."""
    if weight.dtype != torch.bfloat16:
        raise RuntimeError("the bf16dot kernel is bfloat16 only")
    if weight.shape[1] % 64:
        raise RuntimeError(f"in_features {weight.shape[1]} is not a multiple of 64")
    return extension().pack(weight.detach())


def run(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
        bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    return extension().linear(x, packed, weight.shape[0],
                              None if bias is None else bias.detach())


def runs() -> bool:
    """Whether the kernel runs here (building it, the first time on a machine, where it can)."""
    try:
        extension()
    except RuntimeError:
        return False
    return True
