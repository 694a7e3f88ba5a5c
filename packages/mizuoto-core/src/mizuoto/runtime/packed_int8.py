"""Packed int8 linear layers: the faster int8 kernel of the engines' opt-in fast profiles
(never exact).

torch's dynamic int8 ``nn.Linear`` (:mod:`mizuoto.runtime.dynamic_int8`) quantizes its input
to 7 bits on x86 (``reduce_range``, against the 16-bit overflow of AVX2's byte products) and
runs fbgemm through the quantized engine's dispatch. torch also ships fbgemm's int8 linear as
one plain op, ``torch.fbgemm_linear_int8_weight``: the weight quantized (per tensor) and
packed once, the input quantized to a full 8 bits per call. At VoxCPM's shapes on an AMD
EPYC with AVX512-VNNI it took 0.63-0.82 of the dynamic layer's time (1, 10 and 20 rows;
``benchmarks/cpu/int8_kernels.py``) with an output SNR 3 dB higher; oneDNN's VNNI
``qlinear``, ``torch._int_mm``, ``torch._weight_int8pack_mm`` and torchao's int8 layouts
were all slower there than the dynamic layer (the benchmark lists them).

torch marks the op deprecated (one warning per process, taken silently by one call when the
first layer packs, so that a product does not pay for silencing it); a build without it,
or without fbgemm, is found by one 8 × 8 trial, and the engines then keep the dynamic layer.
On a CPU without VNNI the full 8-bit input can saturate fbgemm's 16-bit pair sums: a little
more error, which the fast profile's SNR figures include.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable

import torch
from torch import nn

#: How :mod:`mizuoto.benchmarking.kernels` and ``applied`` name the kernel.
KERNEL_NAME = "int8 packed linear (fbgemm)"


@contextlib.contextmanager
def _quiet():
    """torch warns once per process that the fbgemm ops are deprecated; they still run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@functools.cache
def _take_the_product_warning() -> None:
    """One 1 × 1 product, silenced: torch warns of the deprecated product once per process
    (``TORCH_WARN_ONCE``), so every later call runs without ``warnings.catch_warnings``,
    which costs as much as the product itself at a decode step's small layers (8 µs, one
    thread)."""
    with _quiet():
        weight = torch.ones(1, 1)
        quantized, col_offsets, scale, zero_point = torch.fbgemm_linear_quantize_weight(weight)
        torch.fbgemm_linear_int8_weight(weight, weight, torch.fbgemm_pack_quantized_matrix(
            quantized), col_offsets, scale, zero_point, torch.zeros(1))


class PackedInt8Linear(nn.Module):
    """An ``nn.Linear``'s product through fbgemm's packed int8 kernel: the weight quantized per
    tensor and packed once, here; float32 in and out. Holds no parameters (the packed matrix
    is fbgemm's own memory, not a tensor torch can save): inference only."""

    kernel_name = KERNEL_NAME
    kernel_dtype = "int8"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float().contiguous()
        with _quiet():
            quantized, col_offsets, scale, zero_point = \
                torch.fbgemm_linear_quantize_weight(weight)
            self._packed = torch.fbgemm_pack_quantized_matrix(quantized)
        _take_the_product_warning()
        self._col_offsets, self._scale, self._zero_point = col_offsets, scale, zero_point
        # the op reads the weight's shape only (the packed matrix holds the values)
        self._shape = torch.zeros((), dtype=torch.int8).expand(self.out_features,
                                                               self.in_features)
        bias = linear.bias
        self._bias = (bias.detach().float().clone() if bias is not None
                      else torch.zeros(self.out_features))
        #: the bytes one call reads: int8 weights, int32 column offsets, float32 bias
        self.packed_weight_bytes = self.out_features * (self.in_features + 4 + 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.fbgemm_linear_int8_weight(flat, self._shape, self._packed,
                                              self._col_offsets, self._scale,
                                              self._zero_point, self._bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 packed"


@functools.cache
def packed_int8_unavailable() -> str | None:
    """Why this torch cannot run :class:`PackedInt8Linear` (``None``: it can), from one 8 × 8
    trial per process."""
    if not hasattr(torch, "fbgemm_linear_int8_weight"):
        return f"this torch {torch.__version__} has no torch.fbgemm_linear_int8_weight"
    try:
        with torch.no_grad():
            PackedInt8Linear(nn.Linear(8, 8))(torch.ones(2, 8))
    except (RuntimeError, NotImplementedError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else repr(exc)
        return f"this torch {torch.__version__} has no fbgemm int8 kernel here ({first_line})"
    return None


def pack_int8_linears(roots: Iterable[nn.Module]) -> int:
    """Replace every ``nn.Linear`` inside each of ``roots`` by a :class:`PackedInt8Linear` in
    place; how many were. A root that is itself a bare ``nn.Linear`` is kept (the projections
    between components stay float32, as with the dynamic layers)."""
    count = 0
    for root in roots:
        for parent in list(root.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, PackedInt8Linear(child))
                    count += 1
    return count
