"""Packed int8 linear layers: the faster int8 kernel of the engines' opt-in fast profiles
(never exact).

torch's dynamic int8 ``nn.Linear`` (:mod:`mizuoto.runtime.dynamic_int8`) quantizes its input
to 7 bits on x86 (``reduce_range``, against the 16-bit overflow of AVX2's byte products) and
runs fbgemm through the quantized engine's dispatch. torch also ships fbgemm's int8 linear as
one plain op, ``torch.fbgemm_linear_int8_weight``: the weight packed once, the input quantized
to a full 8 bits per call. At VoxCPM's shapes on an AMD EPYC with AVX512-VNNI it took
0.63-0.82 of the dynamic layer's time (1, 10 and 20 rows; ``benchmarks/cpu/int8_kernels.py``)
with an output SNR 3 dB higher; oneDNN's VNNI ``qlinear``, ``torch._int_mm``,
``torch._weight_int8pack_mm`` and torchao's int8 layouts were all slower there than the
dynamic layer (the benchmark lists them).

The weight is quantized symmetrically per output channel, here: the op takes one weight scale
(per tensor), so it runs with a unit scale and no zero point, and the channels' scales multiply
its float output. Each output channel is then its own integer dot product with the input's one
quantization, times its own scale, so layers that read the same input fuse into one product
(:meth:`PackedInt8Linear.fused`: a transformer's q/k/v, its gate/up) whose outputs are each
layer's own bits, for one call (one parallel region, one quantization of the input) instead
of several.

torch marks the op deprecated (one warning per process, taken silently by one call when the
first layer packs, so that a product does not pay for silencing it); a build without it,
or without fbgemm, is found by one 8 × 8 trial, and the engines then keep the dynamic layer.
On a CPU without VNNI (AVX2's ``vpmaddubsw``) fbgemm sums each pair of byte products into 16
bits with saturation: a full 8-bit input (up to 255) times full 8-bit weights (up to 127) can
reach 64,770 and clip at 32,767. With weights quantized per channel every channel reaches 127,
so this clipped often: an output SNR of 19 dB against 34 dB with VNNI, for 64 × 48 random
weights, on an AMD EPYC with AVX2 only. Where one probe product shows the clipping
(:func:`weight_levels`), the weights are quantized to 7 bits (±63: a pair sums to at most
32,130), as torch's dynamic layer narrows its input instead.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable, Sequence

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


@functools.cache
def weight_levels() -> int:
    """The largest quantized weight magnitude (127, or 63 where this CPU's int8 kernel clips a
    pair of byte products at 16 bits): one product whose every pair reaches 2 × 255 × 127 if it
    is not clipped, per process."""
    with _quiet(), torch.no_grad():
        weight = torch.ones(1, 64)
        quantized, col_offsets, scale, zero_point = torch.fbgemm_linear_quantize_weight(weight)
        out = torch.fbgemm_linear_int8_weight(
            torch.ones(1, 64), weight, torch.fbgemm_pack_quantized_matrix(quantized),
            col_offsets, scale, zero_point, torch.zeros(1))
    return 127 if abs(float(out) - 64.0) < 1.0 else 63


class PackedInt8Linear(nn.Module):
    """An ``nn.Linear``'s product through fbgemm's packed int8 kernel: the weight quantized per
    output channel and packed once, here; float32 in and out. Holds no parameters (the packed
    matrix is fbgemm's own memory, not a tensor torch can save): inference only."""

    kernel_name = KERNEL_NAME
    kernel_dtype = "int8"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self._pack(linear.weight, linear.bias)
        #: the output sizes of the layers this product stands for, in order (one: itself)
        self.split_sizes = (self.out_features,)

    @classmethod
    def fused(cls, linears: Sequence[nn.Linear]) -> PackedInt8Linear:
        """One product for ``linears`` (the same input size, read from the same input): their
        outputs concatenated in order, each the bits its own :class:`PackedInt8Linear` gives
        (per-channel weights, one quantization of the input); ``split_sizes`` says how to
        split them."""
        sizes = {linear.in_features for linear in linears}
        if len(sizes) != 1:
            raise ValueError(f"fused layers must read one input size, not {sorted(sizes)}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        biases = [linear.bias for linear in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b.detach() if b is not None else torch.zeros(linear.out_features)
                              for b, linear in zip(biases, linears, strict=True)])
        layer._pack(torch.cat([linear.weight.detach() for linear in linears]), bias)
        layer.split_sizes = tuple(linear.out_features for linear in linears)
        return layer

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float()
        levels = weight_levels()  # 63 where the kernel would clip byte-product pairs (AVX2)
        # each row's largest magnitude in one pass (abs().amax() made a copy first: 0.7x)
        largest = torch.linalg.vector_norm(weight, float("inf"), dim=1)
        scale = largest.clamp_min(torch.finfo(torch.float32).tiny) / levels
        # in place: fresh temporaries for each step made this 10x slower (a whole model's load)
        rounded = weight / scale[:, None]
        rounded.round_().clamp_(-levels, levels)
        # with no zero point, a column's offset is the sum of its quantized weights (exact in
        # float32: integers below 2**24 for any in_features under 132,000)
        self._col_offsets = rounded.sum(dim=1).to(torch.int32)
        with _quiet():
            self._packed = torch.fbgemm_pack_quantized_matrix(
                rounded.to(torch.int8).contiguous())
        _take_the_product_warning()
        self._channel_scale = scale
        # the op reads the weight's shape only (the packed matrix holds the values)
        self._shape = torch.zeros((), dtype=torch.int8).expand(self.out_features,
                                                               self.in_features)
        self._zeros = torch.zeros(self.out_features)  # the op's bias: added after the scale
        self._bias = bias.detach().float().clone() if bias is not None else None
        #: the bytes one call reads: int8 weights, int32 column offsets, float32 scales and the
        #: op's bias, float32 bias
        self.packed_weight_bytes = self.out_features * (
            self.in_features + 4 + 4 + 4 + (4 if bias is not None else 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.fbgemm_linear_int8_weight(flat, self._shape, self._packed,
                                              self._col_offsets, 1.0, 0, self._zeros)
        out.mul_(self._channel_scale)
        if self._bias is not None:
            out.add_(self._bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8 packed per channel"
                + (f", fused {'+'.join(map(str, self.split_sizes))}"
                   if len(self.split_sizes) > 1 else ""))


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
