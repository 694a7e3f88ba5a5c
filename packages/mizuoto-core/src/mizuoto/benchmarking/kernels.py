"""Which kernel each layer of a profiled request ran, and how fast the kernels run here.

A profile's percentages are only as honest as the floor under them. Three are given, from the
loosest to the strictest against the kernel:

- **bandwidth**: the call's weights read once at the measured memory bandwidth;
- **kernel**: also its multiply-adds at the rate of the kernel that ran, measured here on a
  large product (a slow kernel gets a low floor: this one says how well the call feeds its
  kernel, not whether the kernel is good);
- **CPU**: also its multiply-adds at the best rate this CPU reaches in that dtype, measured
  with the fastest large-product kernel torch offers for it here (float32: MKL, oneDNN;
  bfloat16: oneDNN, on native bfloat16 instructions where the CPU has them; int8: oneDNN's
  VNNI ``qlinear``, ``torch._int_mm``, fbgemm), so that a slow kernel cannot look near its
  floor.

:func:`layer_kernel` names a layer's kernel after the request (prepacked layers pack lazily);
:func:`measure_kernel_rates` times the kernels in use and every probe of their dtypes.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterable

import attrs
import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

#: A probe: the side of a square product -> (one product to time, its multiply-adds).
Probe = Callable[[int], tuple[Callable[[], object], int]]


@functools.cache
def native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 on this CPU's own instructions (AVX512-BF16, AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layer_kernel(layer: nn.Module) -> tuple[str, str]:
    """``(kernel, dtype)`` of a counted layer as it ran: a layer naming its own kernel
    (``kernel_name``, ``kernel_dtype``: Mizuoto's fast int8 linears), a torch dynamic int8
    linear (its quantized engine's kernel), a prepacked linear (the packed kernel it used, if
    any), else torch's own kernel for the layer's class and dtype."""
    own = getattr(layer, "kernel_name", None)
    if isinstance(own, str):
        return own, getattr(layer, "kernel_dtype", "int8")
    if type(layer).__module__.startswith("torch.ao.nn.quantized.dynamic"):
        engine = torch.backends.quantized.engine
        # the x86 engine runs dynamic linears through fbgemm
        return f"int8 dynamic linear ({'fbgemm' if engine in ('x86', 'fbgemm') else engine})", \
            "int8"
    weight = getattr(layer, "weight", None)
    dtype = _dtype_name(weight.dtype) if isinstance(weight, torch.Tensor) else "float32"
    if isinstance(layer, nn.Conv1d):
        return f"torch {dtype} conv1d", dtype
    if isinstance(layer, nn.ConvTranspose1d):
        packed = getattr(layer, "prepacked_kernels", None)
        return (f"{dtype} conv_transpose1d (prepacked)" if packed
                else f"torch {dtype} conv_transpose1d"), dtype
    packed = getattr(layer, "prepacked_kernel", None)
    if packed == "bf16dot":
        return "bf16dot linear (Mizuoto, prepacked)", dtype
    if packed is not None:
        return f"{dtype} linear ({'oneDNN' if packed == 'onednn' else 'MKL'}, prepacked)", dtype
    if dtype == "float32":
        return "torch float32 linear (MKL)", dtype
    if dtype == "bfloat16":
        return f"torch bfloat16 linear ({'oneDNN' if native_bf16() else 'reference'})", dtype
    return f"torch {dtype} linear", dtype


def kernel_counts(layers: Iterable[nn.Module]) -> dict[str, int]:
    """How many of ``layers`` ran each kernel, the most used first."""
    counts: dict[str, int] = {}
    for layer in layers:
        name = layer_kernel(layer)[0]
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _linear_probe(dtype: torch.dtype) -> Probe:
    def probe(side):
        a, w = torch.randn(side, side).to(dtype), torch.randn(side, side).to(dtype)
        return (lambda: F.linear(a, w)), side ** 3
    return probe


def _onednn_probe(dtype: torch.dtype) -> Probe:
    def probe(side):
        a, w = torch.randn(side, side).to(dtype), torch.randn(side, side).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return (lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")), \
            side ** 3
    return probe


def _mkl_packed_probe(side):
    a, w = torch.randn(side, side), torch.randn(side, side)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, side)
    return (lambda: torch.ops.mkl._mkl_linear(a, packed, w, None, side)), side ** 3


def _bf16dot_probe(side):
    from mizuoto.runtime import bf16_dot

    if not bf16_dot.runs():
        raise RuntimeError("the bf16dot kernel does not run here")
    a, w = torch.randn(side, side).bfloat16(), torch.randn(side, side).bfloat16()
    packed = bf16_dot.pack(w, side)
    return (lambda: bf16_dot.run(a, packed, w, None, side)), side ** 3


def _dynamic_int8_probe(engine: str) -> Probe:
    def probe(side):
        from torch.ao.quantization import quantize_dynamic

        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = engine
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                layer = quantize_dynamic(nn.Sequential(nn.Linear(side, side, bias=False)),
                                         {nn.Linear}, dtype=torch.qint8)
            a = torch.randn(side, side)
            layer(a[:1])
        finally:
            torch.backends.quantized.engine = previous

        def run():
            previous = torch.backends.quantized.engine
            torch.backends.quantized.engine = engine
            try:
                layer(a)
            finally:
                torch.backends.quantized.engine = previous
        return run, side ** 3
    return probe


def _onednn_qlinear_probe(side):
    a = torch.randint(0, 255, (side, side), dtype=torch.uint8)
    w = torch.randint(-127, 127, (side, side), dtype=torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    scales, zeros = torch.ones(side), torch.zeros(side, dtype=torch.int64)
    return (lambda: torch.ops.onednn.qlinear_pointwise(
        a, 0.1, 0, packed, scales, zeros, None, 1.0, 0, torch.float32, "none", [], "")), \
        side ** 3


def _packed_int8_probe(side):
    from mizuoto.runtime.packed_int8 import PackedInt8Linear

    layer, a = PackedInt8Linear(nn.Linear(side, side, bias=False)), torch.randn(side, side)
    return (lambda: layer(a)), side ** 3


def _int_mm_probe(side):
    a = torch.randint(-127, 127, (side, side), dtype=torch.int8)
    w = torch.randint(-127, 127, (side, side), dtype=torch.int8)
    return (lambda: torch._int_mm(a, w)), side ** 3


def _conv_probe(transpose: bool, dtype: torch.dtype) -> Probe:
    def probe(side):
        channels, taps = side // 2, 4
        x = torch.randn(1, channels, side).to(dtype)
        w = torch.randn(channels, channels, taps).to(dtype)
        conv = F.conv_transpose1d if transpose else F.conv1d
        return (lambda: conv(x, w)), channels * channels * taps * side
    return probe


@functools.cache
def kernel_probes() -> dict[str, tuple[str, Probe]]:
    """Kernel name -> (dtype, probe): the probes of a dtype are the candidates for its CPU
    rate. torch's own bfloat16 linear is named for what it runs here."""
    bf16_linear = f"torch bfloat16 linear ({'oneDNN' if native_bf16() else 'reference'})"
    return {**_KERNEL_PROBES, bf16_linear: ("bfloat16", _linear_probe(torch.bfloat16))}


_KERNEL_PROBES: dict[str, tuple[str, Probe]] = {
    "torch float32 linear (MKL)": ("float32", _linear_probe(torch.float32)),
    "float32 linear (MKL, prepacked)": ("float32", _mkl_packed_probe),
    "float32 linear (oneDNN, prepacked)": ("float32", _onednn_probe(torch.float32)),
    "bfloat16 linear (oneDNN, prepacked)": ("bfloat16", _onednn_probe(torch.bfloat16)),
    "bf16dot linear (Mizuoto, prepacked)": ("bfloat16", _bf16dot_probe),
    "int8 dynamic linear (fbgemm)": ("int8", _dynamic_int8_probe("x86")),
    "int8 dynamic linear (onednn)": ("int8", _dynamic_int8_probe("onednn")),
    "int8 packed linear (fbgemm)": ("int8", _packed_int8_probe),
    "int8 qlinear (oneDNN, VNNI)": ("int8", _onednn_qlinear_probe),
    "int8 _int_mm (torch)": ("int8", _int_mm_probe),
    "torch float32 conv1d": ("float32", _conv_probe(False, torch.float32)),
    "torch float32 conv_transpose1d": ("float32", _conv_probe(True, torch.float32)),
    # measured as torch's own: the packed one runs its oneDNN primitive or one GEMM and a fold
    "float32 conv_transpose1d (prepacked)": ("float32", _conv_probe(True, torch.float32)),
    "torch bfloat16 conv1d": ("bfloat16", _conv_probe(False, torch.bfloat16)),
    "torch bfloat16 conv_transpose1d": ("bfloat16", _conv_probe(True, torch.bfloat16)),
}

#: Probe sides: the small one first; the large one where the small took under
#: ``LARGE_AFTER_S`` (a kernel without a fast path here would take seconds at the large side)
SIDES = (256, 1024)
LARGE_AFTER_S = 0.004


@attrs.frozen
class KernelRates:
    """Multiply-adds per second (G) measured here: ``kernels`` per kernel name; ``cpu`` per
    dtype the best of its probes, as ``(rate, kernel)``."""

    kernels: dict[str, float]
    cpu: dict[str, tuple[float, str]]

    def kernel(self, name: str) -> float | None:
        return self.kernels.get(name)

    def best(self, dtype: str) -> float | None:
        found = self.cpu.get(dtype)
        return found[0] if found else None


def _rate(probe: Probe, sides: tuple[int, ...], repeats: int) -> float:
    best = 0.0
    for side in sides:
        run, macs = probe(side)
        run()
        fastest = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            fastest = min(fastest, time.perf_counter() - start)
        best = max(best, macs / fastest / 1e9)
        if fastest > LARGE_AFTER_S:
            break
    return best


def measure_kernel_rates(in_use: Iterable[tuple[str, str]], *,
                         sides: tuple[int, ...] = SIDES, repeats: int = 3,
                         probes: dict[str, tuple[str, Probe]] | None = None) -> KernelRates:
    """The rate of each kernel in ``in_use`` (``(kernel, dtype)`` pairs; one with no probe
    here has none) and, per dtype among them, the best rate of all that dtype's probes (those
    this torch or CPU cannot run are skipped, logged)."""
    probes = kernel_probes() if probes is None else probes
    in_use = set(in_use)
    dtypes = {dtype for _, dtype in in_use}
    measured: dict[str, float] = {}
    with torch.no_grad():
        for name, (dtype, probe) in probes.items():
            if dtype not in dtypes:
                continue
            try:
                measured[name] = _rate(probe, sides, repeats)
            except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
                log.info("kernel probe %s does not run here: %s", name, exc)
    cpu: dict[str, tuple[float, str]] = {}
    for name, rate in measured.items():
        dtype = probes[name][0]
        if rate > cpu.get(dtype, (0.0, ""))[0]:
            cpu[dtype] = (rate, name)
    return KernelRates(kernels={name: measured[name] for name, _ in sorted(in_use)
                                if name in measured}, cpu=cpu)
