"""Device and dtype choice from ``compute.device`` / ``compute.dtype``.

``auto`` picks CUDA, then Apple MPS, then the CPU. The dtype policy belongs to each engine
(it runs as its upstream does), so :func:`select_dtype` takes the engine's ``auto`` choice.
:func:`cpu_native_dtype` says whether this CPU computes a reduced precision natively, and
:func:`emulated_dtype_warning` words the ``Applied`` warning when it does not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from mizuoto.errors import InvalidOption
from mizuoto.options import ComputeOptions

#: ``compute.dtype`` names and their torch dtypes.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

AutoDtype = torch.dtype | Callable[[torch.device], torch.dtype]


def default_device() -> torch.device:
    """The common ``auto`` rule: CUDA, then Apple MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def cuda_or_cpu() -> torch.device:
    """An ``auto`` rule that never picks MPS (an upstream on a trainer that knows only CUDA and
    the CPU, as a bare accelerate ``Accelerator(cpu=False)`` loop written for CUDA): CUDA, else
    the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def preferred_device(preferred: str) -> torch.device:
    """An ``auto`` rule for engines whose model files name a device (VoxCPM's config): that
    device where it is available here, else :func:`default_device`."""
    if preferred == "cpu":
        return torch.device("cpu")
    if preferred.startswith("cuda") and torch.cuda.is_available():
        return torch.device(preferred)
    if preferred == "mps" and _mps_available():
        return torch.device("mps")
    return default_device()


def select_device(compute: ComputeOptions | str = "auto", *,
                  auto: Callable[[], torch.device] = default_device) -> torch.device:
    """The device named by ``compute.device`` (``auto``, ``cpu``, ``cuda[:n]``, ``mps``);
    ``auto`` is the engine's rule (default: :func:`default_device`).

    Raises :class:`InvalidOption` when the named backend is not available here.
    """
    name = compute.device if isinstance(compute, ComputeOptions) else compute
    if name == "auto":
        return auto()
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise InvalidOption("compute.device", f"{name!r} is not a device: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidOption("compute.device", "CUDA is not available on this machine "
                                "(use compute.device=auto or cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InvalidOption("compute.device", f"{name} does not exist: "
                                f"{torch.cuda.device_count()} CUDA device(s) here")
    elif device.type == "mps" and not _mps_available():
        raise InvalidOption("compute.device", "Apple MPS is not available on this machine "
                            "(use compute.device=auto or cpu)")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise InvalidOption("compute.device", f"{name!r} is not cpu, cuda or mps")
    return device


def select_dtype(
    compute: ComputeOptions | str,
    device: torch.device,
    *,
    auto: AutoDtype = torch.float32,
    supported: tuple[torch.dtype, ...] = tuple(DTYPES.values()),
) -> torch.dtype:
    """The dtype named by ``compute.dtype``; ``auto`` is the engine's choice for ``device``.

    ``auto`` is a dtype or a function of the device (an engine passes its upstream's rule).
    A dtype the engine does not support, or bfloat16 on a CUDA device without it, raises
    :class:`InvalidOption`.
    """
    name = compute.dtype if isinstance(compute, ComputeOptions) else compute
    if name == "auto":
        dtype = auto(device) if callable(auto) else auto
    elif name in DTYPES:
        dtype = DTYPES[name]
    else:
        raise InvalidOption("compute.dtype", f"must be auto or one of {', '.join(DTYPES)}, "
                            f"got {name!r}")
    if dtype not in supported:
        names = ", ".join(dtype_name(d) for d in supported)
        raise InvalidOption("compute.dtype", f"{dtype_name(dtype)} is not supported by this "
                            f"engine (use auto or one of {names})")
    if dtype == torch.bfloat16 and device.type == "cuda" and not bf16_supported(device):
        raise InvalidOption("compute.dtype", f"{describe(device)} has no bfloat16 support "
                            "(use float16 or float32)")
    return dtype


def half_precision_or_float32(device: torch.device) -> torch.dtype:
    """A common ``auto`` rule: float16 on CUDA, float32 elsewhere."""
    return torch.float16 if device.type == "cuda" else torch.float32


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (CPU and MPS: emulated or recent only)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported()
    return True


# /proc/cpuinfo flags that give native kernels, used only when torch cannot say itself
_NATIVE_FLAGS = {
    torch.bfloat16: frozenset({"avx512_bf16", "amx_bf16", "bf16"}),  # x86, x86, Arm
    torch.float16: frozenset({"avx512_fp16", "amx_fp16"}),
}
_ONEDNN_CHECKS = {torch.bfloat16: "_is_mkldnn_bf16_supported",
                  torch.float16: "_is_mkldnn_fp16_supported"}


@functools.cache
def cpu_native_dtype(dtype: torch.dtype) -> bool:
    """Whether this CPU runs ``dtype`` matrix products natively (float32 always does).

    bfloat16 and float16 products on the CPU are fast only through oneDNN's kernels, which
    torch uses when the CPU has them (bfloat16: AVX-512 or AMX on x86, BF16 on Arm; float16:
    AVX512-FP16 or AMX-FP16); otherwise torch converts in plain loops, several times slower than
    float32 (an AVX2 CPU: about 3x for a 64x1024 by 1024x4096 product). Asks torch first;
    where it cannot say, reads the CPU flags in ``/proc/cpuinfo``.
    """
    if dtype not in _ONEDNN_CHECKS:
        return True
    mkldnn = torch.backends.mkldnn
    check = getattr(torch.ops.mkldnn, _ONEDNN_CHECKS[dtype], None) \
        if mkldnn.is_available() else None
    if check is not None:
        try:
            return bool(mkldnn.enabled) and bool(check())
        except RuntimeError:
            pass
    return native_from_flags(dtype, _cpu_flags())


def native_from_flags(dtype: torch.dtype, flags: frozenset[str]) -> bool:
    """:func:`cpu_native_dtype` from a set of ``/proc/cpuinfo`` flags (the fallback)."""
    return dtype not in _NATIVE_FLAGS or bool(_NATIVE_FLAGS[dtype] & flags)


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, Arm
            return frozenset(value.split())
    return frozenset()


def emulated_dtype_warning(dtype: torch.dtype, device: torch.device | str, *, setting: str,
                           speedup: str | Callable[[], str | None],
                           fast_hint: str = "") -> str | None:
    """A line for ``Applied.warnings`` when ``dtype`` runs on a CPU without native kernels for it,
    naming the faster setting (``setting=float32``) and ``speedup`` (what was measured, e.g.
    ``"about 1.6x"``), then ``fast_hint`` where the engine has a faster, inexact profile for
    such a CPU (e.g. ``"engines.x.fast=int8 (not exact) is about 4x faster than float32"``);
    ``None`` when there is nothing to say (also when ``speedup`` is a function returning
    ``None``: the caller runs the dtype faster than float32 anyway)."""
    if torch.device(device).type != "cpu" or cpu_native_dtype(dtype):
        return None
    if callable(speedup):  # asked only now: it may look for a kernel (e.g. build one)
        speedup = speedup()
        if speedup is None:
            return None
    name = dtype_name(dtype)
    line = (f"{name} is emulated on this CPU ({torch.backends.cpu.get_cpu_capability()}, no "
            f"native {name} kernels): {setting}=float32 is {speedup} faster on such a CPU (its "
            f"samples differ from {name}'s)")
    return f"{line}; {fast_hint}" if fast_hint else line


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def describe(device: torch.device | str) -> str:
    """One line for logs and ``Applied``: ``cuda:0 (NVIDIA H200, 139.7 GiB, sm_90)``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        memory = props.total_memory / 2**30
        return f"cuda:{index} ({props.name}, {memory:.1f} GiB, sm_{props.major}{props.minor})"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())
