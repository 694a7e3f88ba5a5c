"""An audio decoder's transposed and pointwise convolutions as packed int8 products (a fast
profile's, never exact).

A transposed convolution is one matrix product and a ``col2im``: its columns are
``W^T x`` (the weight ``(in, out, kernel)`` read as ``(in, out * kernel)``), then
``F.fold`` sums the overlapping columns, then the bias (``slow_conv_transpose2d``'s steps).
At a stream's few frames the product reads the whole weight for a handful of columns: VoxCPM-0.5B's
first upsampling, 75 MB of float32 for 6 frames, took 14-20 ms a patch with MKL's float32
GEMM on an AMD EPYC with AVX2 only (2 threads; oneDNN's packed float32 linear 4.9 ms), and
0.8 ms as fbgemm's packed int8 product (:class:`~mizuoto.runtime.packed_int8.PackedInt8Linear`:
19 MB of int8 weights, quantized per output channel). A pointwise ``Conv1d`` (kernel 1) is a
linear layer over the channels of each frame, and packs the same way.

The layers keep their parameters and state dict (the weights stay float32 beside the packed
copy: a save sees them unchanged; a weight loaded or changed in place is packed again on the
next call); gradients, another dtype or device run torch's own convolution. :func:`pack_int8_convolutions` turns the layers of a module
into these in place, keeping each layer's own ``forward`` (a causal layer's trimming, its
streaming state): the int8 product sits where its ``super().forward`` lands.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.packed_int8 import PackedInt8Linear
from mizuoto.runtime.weight_stamp import weight_stamp

__all__ = ["Int8ConvTranspose1d", "Int8PointwiseConv1d", "pack_int8_convolutions"]


def _runs_int8(layer: nn.Module, x: torch.Tensor) -> bool:
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 3
            and layer.weight.dtype == torch.float32 and not (torch.is_grad_enabled() and (
                x.requires_grad or layer.weight.requires_grad))):
        return False
    if layer._int8_stamp != weight_stamp(layer.weight):  # a weight loaded or changed since
        layer._init_int8()
    return True


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> PackedInt8Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return PackedInt8Linear(linear)


class Int8ConvTranspose1d(nn.ConvTranspose1d):
    """An ``nn.ConvTranspose1d`` (one group) whose columns are one packed int8 product."""

    #: mizuoto.runtime.prepack_conv_transpose leaves it alone: it has its own kernel
    prepackable = False
    kernel_name = PackedInt8Linear.kernel_name
    kernel_dtype = PackedInt8Linear.kernel_dtype

    def _init_int8(self) -> None:
        weight = self.weight.detach().float()
        # (in, out, kernel) -> rows out * kernel of the columns' product, out-major as col2im
        # reads them
        self._columns = _linear(weight.reshape(weight.shape[0], -1).t(), None)
        self._int8_stamp = weight_stamp(self.weight)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if not _runs_int8(self, x) or args or kwargs:
            return super().forward(x, *args, **kwargs)
        batch, channels, frames = x.shape
        (kernel,), (stride,), (padding,) = self.kernel_size, self.stride, self.padding
        (dilation,), (output_padding,) = self.dilation, self.output_padding
        length = ((frames - 1) * stride - 2 * padding + dilation * (kernel - 1)
                  + output_padding + 1)
        columns = self._columns(x.transpose(1, 2).reshape(batch * frames, channels))
        if padding == 0 and dilation == 1 and output_padding == 0 and kernel % stride == 0:
            # kernel = taps x stride (a DAC-style upsampling's 2 x stride): col2im is the sum of
            # the taps' blocks, each shifted by a stride: one strided add each (F.fold took
            # 0.67 ms for VoxCPM-0.5B's first upsampling at 6 frames, AVX2, 2 threads)
            taps = kernel // stride
            blocks = columns.view(batch, frames, -1, taps, stride)
            out = x.new_zeros(batch, blocks.shape[2], length)
            for tap in range(taps):
                out[..., tap * stride:(tap + frames) * stride].view(
                    batch, -1, frames, stride).add_(blocks[:, :, :, tap].transpose(1, 2))
        else:
            columns = columns.view(batch, frames, -1).transpose(1, 2)
            out = F.fold(columns, output_size=(1, length), kernel_size=(1, kernel),
                         dilation=(1, dilation), padding=(0, padding),
                         stride=(1, stride)).squeeze(2)
        if self.bias is not None:
            out.add_(self.bias.reshape(-1, 1))
        return out


class Int8PointwiseConv1d(nn.Conv1d):
    """An ``nn.Conv1d`` of kernel 1 (one group, no padding): a packed int8 linear layer over
    each frame's channels."""

    prepackable = False
    kernel_name = PackedInt8Linear.kernel_name
    kernel_dtype = PackedInt8Linear.kernel_dtype

    def _init_int8(self) -> None:
        self._linear = _linear(self.weight.detach().float()[:, :, 0], self.bias.detach()
                               if self.bias is not None else None)
        self._int8_stamp = weight_stamp(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _runs_int8(self, x):
            return super().forward(x)
        return self._linear(x.transpose(1, 2)).transpose(1, 2)


def _pointwise(layer: nn.Module) -> bool:
    return (isinstance(layer, nn.Conv1d) and layer.kernel_size == (1,) and layer.groups == 1
            and layer.stride == (1,) and layer.padding in ((0,), "valid"))


_subclasses: dict[tuple[type, type], type] = {}


def _int8_class(cls: type, base: type) -> type:
    if cls in (nn.ConvTranspose1d, nn.Conv1d):
        return base
    if (cls, base) not in _subclasses:
        # cls's own forward first; its super().forward() then reaches the int8 one
        _subclasses[cls, base] = type(f"Int8{cls.__name__}", (cls, base),
                                      {"__module__": cls.__module__})
    return _subclasses[cls, base]


def pack_int8_convolutions(roots: Iterable[nn.Module]) -> int:
    """Make every one-group ``nn.ConvTranspose1d`` and every pointwise ``nn.Conv1d`` under
    ``roots`` an int8 one in place (float32 CPU weights); how many were."""
    count = 0
    for root in roots:
        for layer in list(root.modules()):
            if (not isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d))
                    or isinstance(layer, (Int8ConvTranspose1d, Int8PointwiseConv1d))
                    or layer.weight.device.type != "cpu"):
                continue
            if isinstance(layer, nn.ConvTranspose1d) and layer.groups == 1:
                layer.__class__ = _int8_class(type(layer), Int8ConvTranspose1d)
            elif _pointwise(layer):
                layer.__class__ = _int8_class(type(layer), Int8PointwiseConv1d)
            else:
                continue
            layer._init_int8()
            count += 1
    return count
